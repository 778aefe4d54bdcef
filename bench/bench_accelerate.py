#!/usr/bin/env python3
"""Benchmark ``accelerate launch`` through the launcher against Accelerate's own launch of the same
processes.

Run from the repository root (accelerate installed in this interpreter):

    python3 bench/bench_accelerate.py [--repeat 7] [--nproc 2]

One node, --nproc processes of a program that prints one line and exits (start-up is what is
measured: the line is read by Accelerate, torch imported, the processes started and reaped).
Wall time from start until the command exits, median of --repeat, runs interleaved:

- launcher: ``trainer-launcher torch --accelerate -- --num_processes N prog.py`` (what the images'
  ``accelerate`` shim runs): Accelerate's reading in a process of its own, overlapping the torch
  agent's start, then torchrun under the agent;
- accelerate: ``accelerate launch --multi_gpu --num_processes N prog.py``, Accelerate's own
  torchrun path for N processes (on a machine without GPUs it runs them on the CPU all the same;
  its default there would be one process).

The ratio is launcher / accelerate: below 1 the launcher starts the job sooner.
"""

from __future__ import annotations

import argparse
import compileall
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata

from results import record  # bench/results.py: this script's folder is on sys.path

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = os.path.abspath(sys.executable)


def say(text: str = "") -> None:
    print(text, flush=True)


def timed(argv: list[str], env: dict[str, str], cwd: str) -> float:
    start = time.monotonic()
    result = subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            timeout=300, check=False)
    took = time.monotonic() - start
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {result.returncode}: {result.stderr[-2000:]}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--nproc", type=int, default=2)
    args = parser.parse_args()
    compileall.compile_dir(os.path.join(REPO, "launcher"), quiet=1)  # as an installed copy has its bytecode
    accelerate = shutil.which("accelerate", path=os.path.dirname(PY)) or "accelerate"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "LAUNCHER_", "TORCHELASTIC_"))}
    env.update(PYTHONPATH=REPO, PATH=f"{os.path.dirname(PY)}:{env.get('PATH', '/usr/bin:/bin')}")
    with tempfile.TemporaryDirectory() as workdir:
        program = os.path.join(workdir, "prog.py")
        with open(program, "w") as file:
            file.write("print('started', flush=True)\n")
        sides = {
            "launcher": [PY, "-m", "launcher", "torch", "--accelerate", "--", "--num_processes", str(args.nproc),
                         program],
            "accelerate": [accelerate, "launch", "--multi_gpu", "--num_processes", str(args.nproc), program],
        }
        for argv in sides.values():
            timed(argv, env, workdir)  # warm the page cache for both
        times: dict[str, list[float]] = {name: [] for name in sides}
        for _ in range(args.repeat):
            for name, argv in sides.items():
                times[name].append(timed(argv, env, workdir))
    say(f"one node, {args.nproc} processes, median of {args.repeat} (interleaved)")
    for name, values in times.items():
        say(f"  {name:<11} {statistics.median(values):.3f} s   (min {min(values):.3f}, max {max(values):.3f})")
    ratio = statistics.median(times["launcher"]) / statistics.median(times["accelerate"])
    say(f"ratio launcher / accelerate launch: {ratio:.3f}")
    record(
        "accelerate", f"Start-up, one node, {args.nproc} processes: the launcher against accelerate launch",
        ["side", f"median of {args.repeat} (s)", "min (s)", "max (s)", "ratio to accelerate launch"],
        [[name, f"{statistics.median(v):.3f}", f"{min(v):.3f}", f"{max(v):.3f}",
          f"{statistics.median(v) / statistics.median(times['accelerate']):.3f}"] for name, v in times.items()],
        [1, 2, 3, 4], versions={"accelerate": metadata.version("accelerate")})


if __name__ == "__main__":
    main()
