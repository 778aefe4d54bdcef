#!/usr/bin/env python3
"""How often the termination message names the failing MPI rank, per implementation: the
launcher's rank runner (``x.py`` runs as ``python -m launcher.mpi.rank``, which reports the
failure to the launcher itself) against the baseline ``python -m mpi4py x.py`` (the launcher
then reads the rank from mpirun's "rank N aborted" line, which races the abort).

Run from the repository root, as root, after .ci/install-mpi:

    python3 bench/bench_mpi_root_cause.py [--runs 16] [--parallel 4] [--burn 2] [--pods] [--only mpich,...]

Each run is one failing job of bench/programs/mpi_fail.py (rank 1 exits 3, rank 0 sleeps 60 s):
by default ``launcher mpi`` on one host (hostfile ``localhost slots=2``, no ssh, as
bench/bench_mpi.py runs it); with --pods, ``launcher local --mpi IMPL --nnodes 2
--nproc-per-node 1`` (two worker pods over real sshd, as tests/test_mpi.py runs them). Both
sides use the same interpreter and environment; their runs are interleaved, --parallel at a
time, while --burn busy loops load the CPUs. A run that does not exit 3 naming rank 1 keeps its
output and termination message in a directory of its own, whose path is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results import markdown, record  # noqa: E402
from bench_mpi import FAIL, IMPLS, PY, REPO, Impl, impl_env, make_setup  # noqa: E402  (a script in the same folder)

SIDES = {
    "launcher.mpi.rank": (FAIL,),
    "python -m mpi4py": (PY, "-m", "mpi4py", FAIL),
}
JOB_TIMEOUT = 120.0


def job_argv(impl: Impl, program: tuple[str, ...], work: str, pods: bool) -> list[str]:
    if pods:
        return [PY, "-m", "launcher", "local", "--mpi", impl.name, "--nnodes", "2", "--nproc-per-node", "1",
                "--mpirun", impl.mpirun, "--grace-period", "3", "--", *program]
    setup = make_setup(impl, work)  # localhost slots=2, dummy keys, its own ssh dir
    return [PY, "-m", "launcher", "mpi", *setup.options(), "--", *impl.launcher_flags, *program]


def run_once(impl: Impl, program: tuple[str, ...], root: str, pods: bool) -> tuple[int | None, int | None]:
    """(exit code, rootCause.rank) of one failing job."""
    work = tempfile.mkdtemp(dir=root)
    os.chmod(work, 0o777)  # with --pods the ranks run as mpiuser
    termination = os.path.join(work, "termination.json")
    env = impl_env(impl, work, BENCH_DIR=work, LAUNCHER_TERMINATION_LOG=termination, PYTHONPATH=REPO)
    try:
        with open(os.path.join(work, "output.txt"), "wb") as output:
            code = subprocess.run(job_argv(impl, program, work, pods), env=env, cwd=REPO, stdout=output,
                                  stderr=subprocess.STDOUT, timeout=JOB_TIMEOUT).returncode
    except subprocess.TimeoutExpired:
        code = None
    try:
        with open(termination) as handle:
            rank = (json.load(handle).get("rootCause") or {}).get("rank")
    except (OSError, ValueError):
        rank = None
    if (code, rank) != (3, 1):  # a miss: its output and termination message stay, for the cause
        kept = shutil.copytree(work, tempfile.mkdtemp(prefix=f"bench-mpi-root-cause-miss-{impl.key}-"),
                               dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.sock"))
        side = next(name for name, argv in SIDES.items() if argv == program)
        print(f"  {impl.key}, {side}: exit {code}, rank {rank}; kept in {kept}", flush=True)
    return code, rank


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=16, help="failing jobs per implementation and side (default 16)")
    parser.add_argument("--parallel", type=int, default=4, help="jobs at a time (default 4)")
    parser.add_argument("--burn", type=int, default=2, help="CPU busy loops while the jobs run (default 2)")
    parser.add_argument("--pods", action="store_true", help="two worker pods over sshd (local --mpi) instead of localhost")
    parser.add_argument("--only", default="", help="comma-separated implementations: " + ",".join(i.key for i in IMPLS))
    args = parser.parse_args()
    if args.pods and (os.geteuid() != 0 or not shutil.which("sshd")):
        print("bench_mpi_root_cause: needs root and sshd (.ci/install-mpi)", file=sys.stderr)
        return 2
    only = set(filter(None, args.only.split(",")))
    impls = [i for i in IMPLS if (not only or i.key in only) and os.path.exists(i.mpirun)]
    print(f"command: python3 bench/bench_mpi_root_cause.py --runs {args.runs} --parallel {args.parallel} "
          f"--burn {args.burn}{' --pods' if args.pods else ''}{' --only ' + args.only if args.only else ''}")
    print(f"host: {os.cpu_count()} CPUs, {args.burn} busy loops, python {PY}")
    burners = [subprocess.Popen([PY, "-c", "while True: pass"]) for _ in range(args.burn)]
    root = tempfile.mkdtemp(prefix="bench-mpi-root-cause-")
    os.chmod(root, 0o755)
    rows = []
    try:
        for impl in impls:
            jobs = [side for _ in range(args.runs) for side in SIDES]  # interleaved
            started = time.monotonic()
            with ThreadPoolExecutor(args.parallel) as pool:
                results = list(pool.map(lambda side: (side, run_once(impl, SIDES[side], root, args.pods)), jobs))
            named = {side: sum(1 for s, (_, rank) in results if s == side and rank == 1) for side in SIDES}
            exits = {side: sorted({code for s, (code, _) in results if s == side}, key=str) for side in SIDES}
            rows.append((impl.key, named, exits))
            print(f"  {impl.key}: {len(jobs)} jobs in {time.monotonic() - started:.0f} s; rank named: "
                  + ", ".join(f"{side} {named[side]}/{args.runs}" for side in SIDES)
                  + "; exit codes: " + ", ".join(f"{side} {exits[side]}" for side in SIDES))
    finally:
        for burner in burners:
            burner.kill()
        shutil.rmtree(root, ignore_errors=True)
    header = ["implementation", "rank named: launcher.mpi.rank", "rank named: python -m mpi4py (baseline)",
              "exit codes"]
    table = [[key, f"{named['launcher.mpi.rank']}/{args.runs}", f"{named['python -m mpi4py']}/{args.runs}",
              f"{exits['launcher.mpi.rank']} / {exits['python -m mpi4py']}"] for key, named, exits in rows]
    print("\n" + markdown(header, table, [1, 2]))
    record("mpi-root-cause" + ("-pods" if args.pods else ""),
           "MPI: how often the termination message names the failing rank", header, table, [1, 2])
    return 0


if __name__ == "__main__":
    sys.exit(main())
