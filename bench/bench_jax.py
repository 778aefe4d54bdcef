#!/usr/bin/env python3
"""Benchmark ``trainer-launcher jax`` against the same JAX processes started by hand.

Run from the repository root:

    python3 bench/bench_jax.py [--nprocs 2] [--repeat 5] [--baseline-repeat 1] [--baseline-cap 330]

N processes on this machine, each given what Trainer's JAX policy injects into its pod
(JAX_NUM_PROCESSES, JAX_PROCESS_ID, JAX_COORDINATOR_ADDRESS=127.0.0.1:PORT, HOSTNAME), running
bench/programs/jax_bench.py, which initializes JAX the upstream way (the three values by hand).

1. launch overhead  wall time from starting the N processes until all have exited, for a job
                    that initializes and does one cross-process allgather: N ``trainer-launcher
                    jax -- python jax_bench.py ok`` vs N ``python jax_bench.py ok``; runs
                    interleaved, median of --repeat each; goal: ratio <= 1.10
2. failure to exit  process 1 exits 3 after the first allgather while the others block in the
                    second; from its recorded time.time() until every process is gone (for the
                    launcher: every launcher, which outlives its JAX process). JAX alone holds
                    the failed process in its shutdown barrier and the others in the collective
                    (shutdown_timeout 300 s), so the baseline is capped at --baseline-cap seconds
                    and run --baseline-repeat times; a capped run is reported as ">= cap".
"""

from __future__ import annotations

import argparse
import compileall
import os
import platform
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata

from results import record  # bench/results.py: this script's folder is on sys.path

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAM = os.path.join(REPO, "bench", "programs", "jax_bench.py")
PY = sys.executable
RUN_TIMEOUT = 240.0  # a job that should take seconds: anything past this is a hang


def say(text: str = "") -> None:
    print(text, flush=True)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def pod_env(index: int, nprocs: int, port: int, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "LAUNCHER_", "PET_"))}
    env.update({"JAX_NUM_PROCESSES": str(nprocs), "JAX_PROCESS_ID": str(index),
                "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}", "HOSTNAME": f"bench-node-0-{index}",
                "PYTHONPATH": REPO, **extra})
    return env


def command(through_launcher: bool, mode: str) -> list[str]:
    program = [PY, PROGRAM, mode]
    return [PY, "-m", "launcher", "jax", "--", *program] if through_launcher else program


def start(through_launcher: bool, mode: str, nprocs: int, **extra: str) -> list[subprocess.Popen]:
    port = free_port()
    return [subprocess.Popen(command(through_launcher, mode), env=pod_env(i, nprocs, port, **extra), cwd=REPO,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
            for i in range(nprocs)]


def wait_all(processes: list[subprocess.Popen], deadline: float) -> tuple[float | None, list[int | None]]:
    """When the last process exited (None: the deadline came first; the rest are killed)."""
    last = None
    while time.monotonic() < deadline:
        if all(p.poll() is not None for p in processes):
            last = time.monotonic()
            break
        time.sleep(0.005)
    codes = [p.poll() for p in processes]
    for p in processes:
        if p.poll() is None:
            os.killpg(p.pid, 9)
            p.wait()
    return last, codes


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def launch(through_launcher: bool, nprocs: int) -> tuple[float, float]:
    """Wall seconds until every process exited, and the CPU seconds they used (all processes,
    launchers included): on a machine with fewer free CPUs than processes, CPU becomes wall time."""
    cpu = children_cpu()
    began = time.monotonic()
    processes = start(through_launcher, "ok", nprocs)
    ended, codes = wait_all(processes, began + RUN_TIMEOUT)
    if ended is None or any(codes):
        raise SystemExit(f"a good job failed ({'launcher' if through_launcher else 'by hand'}): exit codes {codes}")
    return ended - began, children_cpu() - cpu


def failure(through_launcher: bool, nprocs: int, cap: float) -> tuple[float | None, list[int | None]]:
    with tempfile.TemporaryDirectory(prefix="bench-jax-") as workdir:
        stamp = os.path.join(workdir, "failed-at")
        began = time.monotonic()
        processes = start(through_launcher, "fail", nprocs, FAIL_ID="1", FAIL_STAMP=stamp)
        while not os.path.exists(stamp):
            if time.monotonic() > began + RUN_TIMEOUT or all(p.poll() is not None for p in processes):
                wait_all(processes, time.monotonic())
                raise SystemExit("process 1 never reached its failure")
            time.sleep(0.005)
        with open(stamp) as handle:
            failed_at = float(handle.read())
        offset = time.time() - time.monotonic()  # process 1's wall clock on our monotonic one
        ended, codes = wait_all(processes, failed_at - offset + cap)
        return (None if ended is None else ended - (failed_at - offset)), codes


def seconds(value: float | None, cap: float) -> str:
    return f">= {cap:.0f} s (capped)" if value is None else f"{value:.3f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nprocs", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--baseline-repeat", type=int, default=1)
    parser.add_argument("--baseline-cap", type=float, default=330.0)
    args = parser.parse_args()
    # The launcher's bytecode, as pip install leaves it in an image (PYTHONDONTWRITEBYTECODE=1
    # would otherwise have every launcher compile it from source, a cost no installed copy pays).
    compileall.compile_dir(os.path.join(REPO, "launcher"), quiet=1)

    say(f"# trainer-launcher jax vs JAX processes by hand: {args.nprocs} processes, CPU (gloo)")
    say(f"python {platform.python_version()}, jax {metadata.version('jax')}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.2f}")
    say()
    say("## 1. launch overhead (initialize + one allgather, all processes exited)")
    ours, theirs = [], []
    for _ in range(args.repeat):
        ours.append(launch(True, args.nprocs))
        theirs.append(launch(False, args.nprocs))
    for name, runs in (("through trainer-launcher jax", ours), ("by hand (same env)          ", theirs)):
        walls, cpus = [w for w, _ in runs], [c for _, c in runs]
        say(f"{name}: {' '.join(f'{w:.2f}' for w in walls)} s; median {statistics.median(walls):.3f} s "
            f"(CPU of all its processes: median {statistics.median(cpus):.2f} s)")
    ratio = statistics.median(w for w, _ in ours) / statistics.median(w for w, _ in theirs)
    say(f"ratio {ratio:.3f} (goal <= 1.10: {'met' if ratio <= 1.10 else 'NOT met'}); CPU ratio "
        f"{statistics.median(c for _, c in ours) / statistics.median(c for _, c in theirs):.3f}")
    say()
    say("## 2. failure to exit (process 1 exits 3; until every process is gone)")
    ours_fail = [failure(True, args.nprocs, args.baseline_cap) for _ in range(args.repeat)]
    times = [t for t, _ in ours_fail]
    say(f"through trainer-launcher jax: {' '.join(seconds(t, args.baseline_cap) for t in times)}; exit codes "
        f"{sorted({tuple(c) for _, c in ours_fail})}; median {statistics.median(t or args.baseline_cap for t in times):.3f} s")
    baseline = [failure(False, args.nprocs, args.baseline_cap) for _ in range(args.baseline_repeat)]
    say(f"JAX alone (by hand):          {' '.join(seconds(t, args.baseline_cap) for t, _ in baseline)}; exit codes "
        f"{sorted({tuple(c) for _, c in baseline})} (negative: killed by that signal; None: still running at "
        "the cap, then killed)")
    rows = [[f"launch, {args.nprocs} processes, initialize + one allgather, median of {args.repeat}",
             f"{statistics.median(w for w, _ in ours):.3f} s", f"{statistics.median(w for w, _ in theirs):.3f} s",
             f"{ratio:.3f}", ""]]
    if None not in times:
        ours_median = statistics.median(times)
        theirs_median = statistics.median(args.baseline_cap if t is None else t for t, _ in baseline)
        capped = any(t is None for t, _ in baseline)
        say(f"median {ours_median:.3f} s vs {theirs_median:.1f} s{' (capped)' if capped else ''}: ratio "
            f"{ours_median / theirs_median:.4f}{' (an upper bound)' if capped else ''}")
        rows.append(["process 1 exits 3: until every process is gone", f"{ours_median:.3f} s",
                     f"{theirs_median:.1f} s{' (capped)' if capped else ''}", f"{ours_median / theirs_median:.4f}",
                     f"{sorted({tuple(c) for _, c in ours_fail})} / {sorted({tuple(c) for _, c in baseline})}"])
    record("jax", f"JAX, {args.nprocs} processes on CPU: launch and failure to exit, against JAX by hand",
           ["measure", "through trainer-launcher jax", "by hand (same env)", "ratio", "exit codes"], rows,
           [1, 2, 3], versions={"jax": metadata.version("jax")})


if __name__ == "__main__":
    main()
