#!/usr/bin/env python3
"""Hang detection latency: ``trainer-launcher torch --hang-timeout 10`` against plain torchrun.

Run from the repository root:

    python3 bench/bench_hang.py [--repeat 5] [--hang-timeout 10] [--gloo-timeout 60]

The job: 2 gloo ranks on one node print ``step=N`` for a few all-reduced steps; then rank 0
enters an all-reduce that rank 1 never joins (rank 1 sleeps). Rank 0 records time.time() just
before that call. Measured: from that moment until the command's process has exited.

- launcher: ``python3 -m launcher torch --hang-timeout T -- --standalone --nproc-per-node 2 prog``
  ends the job itself once no progress was seen for T seconds (stacks taken, exit 138, Hang).
- baseline: ``python3 -m torch.distributed.run --standalone --nproc-per-node 2 prog``, as is:
  the job ends only when gloo's own timeout (passed to init_process_group, ``--gloo-timeout``)
  fails rank 0's collective and torchrun stops rank 1.

Runs are interleaved (launcher, baseline, ...); both sides get a clean environment (no PET_*,
no LAUNCHER_*), OMP_NUM_THREADS=1, the same program and the same gloo timeout.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from results import record  # bench/results.py: this script's folder is on sys.path

REPO = Path(__file__).resolve().parents[1]

PROGRAM = """
import datetime, os, sys, time
import torch, torch.distributed as dist

rank = int(os.environ["RANK"])
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ["BENCH_GLOO_TIMEOUT"])))
tensor = torch.ones(4)
for step in range(1, 6):
    dist.all_reduce(tensor)
    print(f"step={step} loss={1.0 / step:.3f}", flush=True)
if rank == 0:
    with open(os.environ["BENCH_HANG_AT"] + ".tmp", "w") as out:
        out.write(repr(time.time()))
    os.replace(os.environ["BENCH_HANG_AT"] + ".tmp", os.environ["BENCH_HANG_AT"])
    dist.all_reduce(tensor)  # rank 1 never joins
else:
    time.sleep(3600)
"""


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PET_", "LAUNCHER_", "TORCHELASTIC_")) and k != "JOB_COMPLETION_INDEX"}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", **extra)
    return env


def run(argv: list[str], workdir: Path, gloo_timeout: float, limit: float) -> dict:
    hang_at = workdir / "hang_at"
    hang_at.unlink(missing_ok=True)
    termination = workdir / "termination.json"
    termination.unlink(missing_ok=True)
    env = clean_env(BENCH_GLOO_TIMEOUT=str(gloo_timeout), BENCH_HANG_AT=str(hang_at),
                    LAUNCHER_TERMINATION_LOG=str(termination))
    with open(workdir / "out", "wb") as out:
        process = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
        try:
            code = process.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            code = None
    ended = time.time()
    output = (workdir / "out").read_text(errors="replace")
    if not hang_at.exists():
        raise SystemExit(f"rank 0 never reached the hanging all-reduce ({argv}):\n{output[-3000:]}")
    result = {"latency": ended - float(hang_at.read_text()), "exit": code, "tail": _last_error(output)}
    if termination.exists():
        data = json.loads(termination.read_text())
        result["reason"] = data.get("reason")
        result["message"] = data.get("message")
    return result


def _last_error(output: str) -> str:
    """The line that says how the job ended."""
    lines = [line for line in output.splitlines() if line.strip()]
    for needle in ("trainer-launcher:", "Timed out", "timed out", "Error", "error"):
        found = [line for line in lines if needle in line]
        if found:
            return found[-1][:300]
    return lines[-1][:300] if lines else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--hang-timeout", type=float, default=10.0)
    parser.add_argument("--gloo-timeout", type=float, default=60.0)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-hang-") as tmp:
        workdir = Path(tmp)
        program = workdir / "prog.py"
        program.write_text(PROGRAM)
        ours = [sys.executable, "-m", "launcher", "torch", "--hang-timeout", f"{args.hang_timeout:g}", "--",
                "--standalone", "--nproc-per-node", "2", str(program)]
        theirs = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                  str(program)]
        print(f"python {platform.python_version()}, {os.cpu_count()} CPUs, {platform.platform()}")
        print("launcher:", " ".join(ours[1:]))
        print("baseline:", " ".join(theirs[1:]))
        limit = args.gloo_timeout * 3 + 60
        results: dict[str, list[dict]] = {"launcher": [], "baseline": []}
        for attempt in range(1, args.repeat + 1):
            for name, argv in (("launcher", ours), ("baseline", theirs)):
                result = run(argv, workdir, args.gloo_timeout, limit)
                results[name].append(result)
                print(f"  run {attempt} {name:8s}: {result['latency']:6.2f} s, exit {result['exit']}, "
                      f"{result.get('reason') or ''} {result['tail']}", flush=True)

    medians = {name: statistics.median(r["latency"] for r in runs) for name, runs in results.items()}
    print()
    print(f"hang -> job ended, median of {args.repeat}:")
    print(f"  launcher (--hang-timeout {args.hang_timeout:g}): {medians['launcher']:.2f} s")
    print(f"  baseline (torchrun, gloo timeout {args.gloo_timeout:g} s): {medians['baseline']:.2f} s")
    print(f"  ratio launcher/baseline: {medians['launcher'] / medians['baseline']:.3f} "
          f"({medians['baseline'] / medians['launcher']:.1f}x sooner)")
    last = results["launcher"][-1]
    print(f"launcher's last outcome: exit {last['exit']}, reason {last.get('reason')}: {last.get('message')}")
    print(f"baseline's last outcome: exit {results['baseline'][-1]['exit']}: {results['baseline'][-1]['tail']}")
    sides = (("launcher", f"launcher (--hang-timeout {args.hang_timeout:g})"),
             ("baseline", f"torchrun (gloo timeout {args.gloo_timeout:g} s)"))
    record("hang", "A 2-rank gloo job whose rank 1 hangs: until the command exited, against plain torchrun",
           ["side", f"median of {args.repeat} (s)", "runs (s)", "exit codes"],
           [[label, f"{medians[side]:.2f}", ", ".join(f"{r['latency']:.2f}" for r in results[side]),
             ", ".join(str(r["exit"]) for r in results[side])] for side, label in sides], [1],
           plot={"title": "a hung rank: seconds until the command exited", "unit": "s",
                 "bars": [[label.split(" (")[0], medians[side]] for side, label in sides]})


if __name__ == "__main__":
    main()
