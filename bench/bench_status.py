#!/usr/bin/env python3
"""The status reporter's overhead on a fast training loop that prints a progress line every step.

Run from the repository root (needs the venv: the stand-in server's certificates use `cryptography`):

    .venv/bin/python bench/bench_status.py [--repeat 5] [--steps 10000] [--step-ms 1]

One rank does ``--steps`` steps of ``--step-ms`` of busy work each (1,000 steps per second by
default) and prints ``step=N/M loss=... lr=...`` after every step. The same command,

    trainer-launcher torch -- --standalone --nproc-per-node 1 prog.py STEPS STEP_MS

runs with the status server's variables pointing at the HTTPS stand-in (tests/status_server.py,
so the launcher parses every line, tracks progress and sends every 5 s) and without them (the
baseline: no monitor at all), interleaved, ``--repeat`` times each. Printed: the median wall time
of each side, the median time of the rank's own loop, and the ratios (goal: wall < 1.01), and the
median CPU time of the whole process tree (steadier than wall time on a busy machine).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from results import record  # noqa: E402  (bench/results.py: this script's folder is on sys.path)

PROGRAM = """\
import sys, time
steps, work = int(sys.argv[1]), float(sys.argv[2]) / 1000
loss = 2.0
started = time.perf_counter()
for step in range(1, steps + 1):
    end = time.perf_counter() + work
    while time.perf_counter() < end:
        pass
    loss *= 0.9995
    print(f"step={step}/{steps} loss={loss:.5f} lr=0.001", flush=True)
print(f"loop_seconds={time.perf_counter() - started:.6f}", file=sys.stderr, flush=True)
"""


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PET_", "LAUNCHER_", "KUBEFLOW_TRAINER_", "TORCHELASTIC_"))}
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = str(REPO)
    return env


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(argv: list[str], env: dict[str, str], workdir: Path, name: str) -> tuple[float, float, float]:
    """(wall seconds of the whole command, the rank's own loop seconds, CPU seconds of the whole tree)."""
    cpu = _children_cpu()
    out, err = workdir / f"{name}.out", workdir / f"{name}.err"
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        start = time.perf_counter()
        code = subprocess.run(argv, env=env, stdout=stdout, stderr=stderr, cwd=workdir, timeout=600).returncode
        wall = time.perf_counter() - start
    text = err.read_text(errors="replace")
    if code != 0:
        raise SystemExit(f"{name}: exit {code}\n{text[-3000:]}")
    loops = [float(line.split("=", 1)[1]) for line in text.splitlines() if "loop_seconds=" in line]
    if not loops:
        raise SystemExit(f"{name}: no loop_seconds line in stderr\n{text[-3000:]}")
    return wall, loops[-1], _children_cpu() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--step-ms", type=float, default=1.0)
    options = parser.parse_args()

    from status_fixtures import StatusServer, make_certs

    workdir = Path(tempfile.mkdtemp(prefix="bench-status-"))
    program = workdir / "prog.py"
    program.write_text(PROGRAM)
    server = StatusServer(workdir / "server", make_certs(workdir / "certs")).start()
    launcher = str(Path(sys.executable).with_name("trainer-launcher"))
    # torchrun's flags go after "--"; torchrun runs the script with this Python.
    argv = [launcher, "torch", "--", "--standalone", "--nproc-per-node", "1",
            str(program), str(options.steps), str(options.step_ms)]
    base_env = clean_env()
    with_env = {**base_env, **server.env()}
    print(f"command: {' '.join(argv[:6])} prog.py {options.steps} {options.step_ms}", flush=True)
    print(f"host: {os.cpu_count()} CPUs, python {sys.version.split()[0]}", flush=True)

    results: dict[str, list[tuple[float, float, float]]] = {"baseline": [], "reporter": []}
    try:
        for index in range(options.repeat):
            for side, env in (("baseline", base_env), ("reporter", with_env)):
                before = len(server.accepted())
                wall, loop, cpu = run(argv, env, workdir, f"{side}-{index}")
                sent = len(server.accepted()) - before
                results[side].append((wall, loop, cpu))
                extra = f", {sent} status updates accepted" if side == "reporter" else ""
                print(f"  run {index + 1} {side:8}: wall {wall:7.3f} s, loop {loop:7.3f} s, CPU {cpu:7.3f} s{extra}",
                      flush=True)
            if not server.accepted():
                raise SystemExit("the reporter sent nothing: is the monitor wired in?")
    finally:
        server.kill()

    medians = {side: tuple(statistics.median(run[i] for run in runs) for i in range(3)) for side, runs in results.items()}
    last = server.accepted()[-1]["body"]
    print(f"last status received: {json.dumps(last)}")
    print(f"median wall: baseline {medians['baseline'][0]:.3f} s, reporter {medians['reporter'][0]:.3f} s, "
          f"ratio {medians['reporter'][0] / medians['baseline'][0]:.4f}")
    print(f"median loop: baseline {medians['baseline'][1]:.3f} s, reporter {medians['reporter'][1]:.3f} s, "
          f"ratio {medians['reporter'][1] / medians['baseline'][1]:.4f}")
    # CPU time is steadier than wall time on a shared machine: what the reporter costs, per line.
    added = medians["reporter"][2] - medians["baseline"][2]
    print(f"median CPU (launcher + torchrun + rank): baseline {medians['baseline'][2]:.3f} s, "
          f"reporter {medians['reporter'][2]:.3f} s, added {added:.3f} s = {added / options.steps * 1e6:.1f} us per line")
    record("status", f"Reporting progress to the TrainJob status: a rank printing {options.steps} lines, "
           f"{options.step_ms:g} ms apart, with and without the status server",
           ["measure", "without status (baseline)", "with status", "ratio"],
           [[what, f"{medians['baseline'][i]:.3f} s", f"{medians['reporter'][i]:.3f} s",
             f"{medians['reporter'][i] / medians['baseline'][i]:.4f}"]
            for i, what in enumerate(("wall", "the rank's loop", "CPU (launcher + torchrun + rank)"))]
           + [["CPU added per line", "", f"{added / options.steps * 1e6:.1f} us", ""]], [1, 2, 3])


if __name__ == "__main__":
    main()
