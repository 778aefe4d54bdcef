"""The benchmarks' results page and plots, rendered from what the benchmarks wrote.

Each benchmark in bench/ writes its final table to ``bench/results/<name>.json`` (bench/results.py):
the table, the command, the date and the machine. :func:`pages` turns them into
``docs/benchmark-results.md`` (one section per result, in :data:`ORDER`) and one SVG per plot under
``docs/img/``: a bar chart for a result that asks for one, a line chart for each group of results
that share a plot group (the S3 download's rate against the data set's size, one point per run of
bench_init.py at a size). Plain SVG, no plotting library: the docs build needs none. Deterministic:
the same JSON files give the same bytes, so tests/test_docs_pages.py can hold them to it.
"""

from __future__ import annotations

import json
from html import escape
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
PAGE = "docs/benchmark-results.md"
IMG = "docs/img"
# The order of the page: the claims first. A result not named here comes after, by name.
ORDER = (
    "failure-propagation", "torch", "hang", "init-at-size-file-s3", "init-mixed-256-file-hf-s3",
    "init-small-file-s3", "init-many-file", "export-hf-s3", "mpi", "mpi-root-cause", "mpi-root-cause-pods", "jax",
    "xgboost-launch", "xgboost-failure",
    "accelerate", "status", "progress-lines",
)
PALETTE = ("#3b6ea8", "#c8553d", "#5b8e4d", "#8c6bb1", "#d4a017", "#6b6b6b")


def results() -> list[dict]:
    found = {path.stem: json.loads(path.read_text()) for path in sorted(RESULTS.glob("*.json"))}
    named = [found.pop(name) for name in ORDER if name in found]
    return named + [found[name] for name in sorted(found)]


def _number(value: float) -> str:
    return f"{value:.3g}" if value < 100 else f"{value:.0f}"


def bar_chart(plot: dict) -> str:
    """Horizontal bars, one per [label, value], each with its value written beside it."""
    bars = plot["bars"]
    top = max(value for _, value in bars) or 1.0
    width, left, right, row = 640, 150, 70, 30
    height = 40 + row * len(bars)
    parts = [_svg_open(width, height), _text(10, 20, plot["title"], weight="bold")]
    for index, (label, value) in enumerate(bars):
        y = 34 + index * row
        length = max(2.0, (width - left - right) * value / top)
        parts.append(_text(left - 8, y + 15, label, anchor="end"))
        colour = PALETTE[index % len(PALETTE)]
        parts.append(f'<rect x="{left}" y="{y}" width="{length:.1f}" height="20" fill="{colour}"/>')
        parts.append(_text(left + length + 6, y + 15, f"{_number(value)} {plot['unit']}"))
    return "\n".join([*parts, "</svg>", ""])


def line_chart(title: str, unit: str, xlabel: str, points: dict[str, list[tuple[float, float]]]) -> str:
    """One line per series over a shared x axis (numbers), the axes' extremes written on them."""
    width, height, left, bottom, top_margin, right = 640, 320, 60, 50, 40, 160
    xs = sorted({x for series in points.values() for x, _ in series})
    ys = [y for series in points.values() for _, y in series]
    x0, x1 = (xs[0], xs[-1]) if xs[0] != xs[-1] else (0.0, xs[0] * 2 or 1.0)
    y1 = max(ys) * 1.1 or 1.0

    def at(x: float, y: float) -> tuple[float, float]:
        return (left + (width - left - right) * (x - x0) / (x1 - x0),
                height - bottom - (height - bottom - top_margin) * y / y1)

    parts = [_svg_open(width, height), _text(10, 20, title, weight="bold")]
    axis = height - bottom
    parts.append(f'<line x1="{left}" y1="{axis}" x2="{width - right}" y2="{axis}" stroke="#333"/>')
    parts.append(f'<line x1="{left}" y1="{top_margin}" x2="{left}" y2="{height - bottom}" stroke="#333"/>')
    for x in xs:
        px, _ = at(x, 0)
        parts.append(_text(px, height - bottom + 16, _number(x), anchor="middle"))
    parts.append(_text((left + width - right) / 2, height - 12, xlabel, anchor="middle"))
    parts.append(_text(left - 6, top_margin + 4, _number(y1), anchor="end"))
    parts.append(_text(left - 6, height - bottom, "0", anchor="end"))
    parts.append(_text(left - 6, top_margin - 14, unit, anchor="end"))
    for index, (name, series) in enumerate(points.items()):
        colour = PALETTE[index % len(PALETTE)]
        placed = [at(x, y) for x, y in sorted(series)]
        if len(placed) > 1:
            path = " ".join(f"{px:.1f},{py:.1f}" for px, py in placed)
            parts.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        parts += [f'<circle cx="{px:.1f}" cy="{py:.1f}" r="4" fill="{colour}"/>' for px, py in placed]
        legend_y = top_margin + 18 * index
        parts.append(f'<rect x="{width - right + 12}" y="{legend_y}" width="12" height="12" fill="{colour}"/>')
        parts.append(_text(width - right + 30, legend_y + 11, name))
    return "\n".join([*parts, "</svg>", ""])


def _svg_open(width: int, height: int) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">')


def _text(x: float, y: float, text: str, anchor: str = "start", weight: str = "normal") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" font-weight="{weight}">'
            f"{escape(str(text))}</text>")


def _machine(machine: dict) -> str:
    versions = ", ".join(f"{name} {version}" for name, version in sorted(machine.get("versions", {}).items()))
    memory = f", {machine['memoryGiB']} GiB" if machine.get("memoryGiB") else ""
    return (f"{machine['cpus']} CPUs{memory}, Python {machine['python']}, {machine['platform']}"
            + (f"; {versions}" if versions else ""))


def _table(result: dict) -> list[str]:
    header, numeric = result["header"], set(result["numeric"])
    lines = ["| " + " | ".join(cell.replace("|", "\\|") for cell in header) + " |",
             "|" + "|".join("---:" if i in numeric else "---" for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in result["rows"]]
    return lines


def pages() -> dict[str, str]:
    """docs/benchmark-results.md and each plot, by path in the checkout."""
    made: dict[str, str] = {}
    found = results()
    scripts = sorted(path.name for path in (REPO / "bench").glob("bench_*.py"))
    recorded = {script for script in scripts for result in found if f"bench/{script}" in result["command"]}
    lines = [
        "<!-- generated by python -m tests.docs_pages from bench/results/*.json; do not edit -->",
        "# Benchmark results",
        "",
        "The last recorded run of each benchmark in `bench/`, as the benchmark wrote it: its table, the",
        "command that produced it, the date and the machine. A benchmark writes `bench/results/<name>.json`",
        "when it finishes (`bench/results.py`), and `python -m tests.docs_pages --write` renders this page and",
        "its plots from those files, so every figure here is one a named command printed. What each benchmark",
        "measures, and what its figures taught us, is in [benchmarks](benchmarks.md).",
        "",
    ]
    groups: dict[str, dict] = {}
    for result in found:
        lines += [f"## {result['title']}", "",
                  f"`{result['command']}`, {result['date']}; {_machine(result['machine'])}", "",
                  *_table(result), ""]
        plot = result.get("plot")
        if plot and "bars" in plot:
            image = f"{IMG}/bench-{result['name']}.svg"
            made[image] = bar_chart(plot)
            lines += [f"![{plot['title']}](img/bench-{result['name']}.svg)", ""]
        # A run's points on the line charts of their groups: one plot, or a list (one per section).
        for point in result.get("plots") or ([plot] if plot and "group" in plot else []):
            group = groups.setdefault(point["group"], {"title": point["title"], "unit": point["unit"],
                                                       "xlabel": point["xlabel"], "points": {}})
            for series, value in point["points"].items():
                group["points"].setdefault(series, []).append((point["x"], value))
    for name, group in sorted(groups.items()):
        image = f"{IMG}/bench-{name}.svg"
        made[image] = line_chart(group["title"], group["unit"], group["xlabel"], group["points"])
        lines += [f"## {group['title']}", "", f"![{group['title']}](img/bench-{name}.svg)", ""]
    missing = [script for script in scripts if script not in recorded]
    if missing:
        lines += ["## Not recorded yet", "", "These benchmarks have no result here yet; each writes one when run:", ""]
        lines += [f"- `python3 bench/{script}`" for script in missing]
        lines.append("")
    made[PAGE] = "\n".join(lines)
    return made
