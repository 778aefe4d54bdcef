"""A benchmark's result as JSON: its table, the command that produced it, when, and on what.

Each benchmark in bench/ ends with a Markdown table; ``record`` writes the same table to
``bench/results/<name>.json``, whole or not at all, beside the machine it ran on (CPUs, memory,
Python, the platform, the versions the benchmark names) and the date. The docs render these files
(``python -m tests.docs_pages --write``): every table in the benchmarks page and its plots come
from them, so a figure there is one that a named command printed on a named machine.
Standard library only: a benchmark runs in whatever interpreter it measures."""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "bench", "results")


def machine(versions: dict[str, str] | None = None) -> dict:
    """What a reader needs to weigh a figure: CPUs, memory, GPUs (none here), Python, the platform."""
    memory = None
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    memory = round(int(line.split()[1]) / (1 << 20), 1)
    except OSError:
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    system = os.uname()  # not platform.platform(): it may start `uname -p`
    return {
        "cpus": usable,
        "memoryGiB": memory,
        "python": platform.python_version(),
        "platform": f"{system.sysname} {system.release} {system.machine}",
        "versions": dict(versions or {}),
    }


def command() -> str:
    """The command line that ran this benchmark, as a reader would type it from the repository root."""
    script = os.path.relpath(os.path.abspath(sys.argv[0]), REPO)
    return shlex.join(["python3", script, *sys.argv[1:]])


def markdown(header: list[str], rows: list[list[str]], numeric: range | list[int] = ()) -> str:
    """The table as Markdown, the columns in ``numeric`` right-aligned: what a benchmark prints last."""
    rule = "|" + "|".join("---:" if i in numeric else "---" for i in range(len(header))) + "|"
    return "\n".join(["| " + " | ".join(header) + " |", rule] + ["| " + " | ".join(row) + " |" for row in rows])


def record(
    name: str,
    title: str,
    header: list[str],
    rows: list[list[str]],
    numeric: range | list[int] = (),
    *,
    versions: dict[str, str] | None = None,
    plot: dict | list[dict] | None = None,
) -> str:
    """Write ``bench/results/<name>.json``; returns its path. ``plot``, when given, asks the docs
    for a bar chart: {"title", "unit", "bars": [[label, value], ...]}; or for this run's points on
    a line chart that results sharing its group make together: {"group", "title", "unit",
    "xlabel", "x", "points": {series: value}}, or a list of those (one per line chart)."""
    if any(len(row) != len(header) for row in rows):
        raise ValueError(f"{name}: every row needs {len(header)} cells")
    document = {
        "name": name,
        "title": title,
        "command": command(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(versions),
        "header": list(header),
        "numeric": sorted(numeric),
        "rows": [[str(cell) for cell in row] for row in rows],
    }
    if isinstance(plot, list):
        document["plots"] = plot
    elif plot is not None:
        document["plot"] = plot
    os.makedirs(RESULTS, exist_ok=True)
    path = os.path.join(RESULTS, f"{name}.json")
    temporary = f"{path}.tmp{os.getpid()}"
    with open(temporary, "w") as handle:
        json.dump(document, handle, indent=1)
        handle.write("\n")
    os.replace(temporary, path)
    return path
