#!/usr/bin/env python3
"""Benchmark ``trainer-launcher xgboost`` against the same processes started by hand.

Run from the repository root:

    python3 bench/bench_xgboost.py [--repeat 5] [--rounds 20] [--fail-cap 30] [--fail-pods 3] [--only launch|failure]

A job is N pods x 1 CPU worker on this machine (2 for launch, --fail-pods for failure), the tracker
at 127.0.0.1 (each pod's launcher gets the DMLC_* variables Trainer would inject; no namespaces). The worker is
bench/programs/xgboost_bench.py, which sets up the collective itself (CommunicatorContext with the
DMLC_* values), so the very same file runs by hand and under the launcher (whose runner it joins).

1. launch   wall time from start until every process has exited, median of --repeat, runs
            interleaved:
            - launcher: two ``python -m launcher xgboost -- python xgboost_bench.py``, pod 0 and 1;
            - by hand, at once: the launcher's own tracker script (launcher/xgboost/tracker.py) and
              the two workers started together (a worker that finds no tracker yet retries after
              xgboost's backoff, 2 s, then 4 s);
            - by hand, tracker first: the workers start once the tracker's port is in LISTEN
              (read from /proc/net/tcp, no probe connection).
            - by hand + floor: tracker first, plus one ``python -c "import pydantic_settings"`` per
              pod started with it: the CPU of the start-up floor every launcher pays (DESIGN.md),
              and nothing of the launcher's own.
            The goal's ratio is against the faster of the first two by-hand ways; a second ratio
            is against by hand + floor. Every run must end with byte-identical models on both
            workers.
2. failure  a job of --fail-pods pods (default 3); one task records time.time() and exits 3 after
            boosting round 2, either through sys.exit(3) or, as a crash, os._exit(3) (no exception
            unwinding through CommunicatorContext, no collective shutdown). From that moment until
            every process of the job has exited, median of --repeat for every side; each run is
            capped at --fail-cap seconds (whatever still lives then is SIGKILLed and the run
            counts as the cap):
            - launcher: one `trainer-launcher xgboost` per pod;
            - by hand, the same processes: the tracker script + the workers;
            - upstream's example: task 0 runs the RabitTracker in-process (MODE=upstream), no
              separate tracker.

Every process gets its own session, and is SIGKILLed by process group after its run.
"""

from __future__ import annotations

import argparse
import compileall
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

from results import markdown, record  # bench/results.py: this script's folder is on sys.path

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAM = os.path.join(REPO, "bench", "programs", "xgboost_bench.py")
TRACKER = os.path.join(REPO, "launcher", "xgboost", "tracker.py")
PY = os.path.abspath(sys.executable)
GOAL = 1.10
RUN_TIMEOUT = 120.0


def say(text: str = "") -> None:
    print(text, flush=True)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def base_env(workdir: str, port: int, workers: int, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "LAUNCHER_", "PET_", "JAX_"))}
    env.update(PYTHONPATH=REPO, BENCH_DIR=workdir, DMLC_TRACKER_URI="127.0.0.1", DMLC_TRACKER_PORT=str(port),
               DMLC_NUM_WORKER=str(workers), PATH=f"{os.path.dirname(PY)}:{env.get('PATH', '/usr/bin:/bin')}", **extra)
    return env


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    exited_at: float | None = None
    code: int | None = None
    waiter: threading.Thread | None = None


@dataclass
class Run:
    procs: list[Proc] = field(default_factory=list)
    started: float = 0.0

    def start(self, name: str, argv: list[str], env: dict[str, str], workdir: str) -> None:
        log = open(os.path.join(workdir, f"{name}.log"), "wb")
        popen = subprocess.Popen(argv, env=env, cwd=REPO, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        proc = Proc(name, popen)

        def wait() -> None:
            proc.code = popen.wait()  # blocks in waitpid: no polling step in the timings
            proc.exited_at = time.time()

        proc.waiter = threading.Thread(target=wait, daemon=True)
        proc.waiter.start()
        self.procs.append(proc)

    def wait_all(self, cap: float) -> bool:
        """True if every process exited before ``cap`` seconds from the start."""
        for proc in self.procs:
            proc.waiter.join(max(0.0, self.started + cap - time.time()))
        return all(proc.exited_at is not None for proc in self.procs)

    def end(self) -> float:
        return max(proc.exited_at for proc in self.procs)

    def kill(self) -> None:
        for proc in self.procs:
            try:
                os.killpg(proc.popen.pid, signal.SIGKILL)  # its session: every process it started
            except OSError:
                pass
            proc.waiter.join(10)


def listening(port: int) -> bool:
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as handle:
                next(handle)
                for line in handle:
                    local, state = line.split()[1], line.split()[3]
                    if int(local.rsplit(":", 1)[1], 16) == port and state == "0A":
                        return True
        except OSError:
            pass
    return False


def models_agree(workdir: str) -> bool:
    found = [open(os.path.join(workdir, f"model-{t}.ubj"), "rb").read()
             for t in (0, 1) if os.path.exists(os.path.join(workdir, f"model-{t}.ubj"))]
    return len(found) == 2 and found[0] == found[1]


def launcher_pods(run: Run, workdir: str, port: int, workers: int = 2, **extra: str) -> None:
    for pod in range(workers):
        env = base_env(workdir, port, workers, DMLC_TASK_ID=str(pod), MODE="explicit",
                       LAUNCHER_TERMINATION_LOG=os.path.join(workdir, f"pod{pod}.json"), **extra)
        run.start(f"pod{pod}", [PY, "-m", "launcher", "xgboost", "--", "python", PROGRAM], env, workdir)


# What every launcher must import (pydantic-settings, the design's start-up floor), as a process
# of its own per pod: a by-hand job paying the floor's CPU beside its own, and nothing else.
FLOOR = [PY, "-c", "import pydantic_settings"]


def by_hand(run: Run, workdir: str, port: int, tracker_first: bool, workers: int = 2, floor: bool = False,
            **extra: str) -> None:
    env = base_env(workdir, port, workers, MODE="explicit", **extra)
    for pod in range(workers if floor else 0):
        run.start(f"floor{pod}", FLOOR, env, workdir)
    run.start("tracker", [PY, TRACKER, "--workers", str(workers), "--port", str(port)], env, workdir)
    if tracker_first:
        while not listening(port):
            if run.procs[-1].exited_at is not None or time.time() - run.started > RUN_TIMEOUT:
                return
            time.sleep(0.005)
    for task in range(workers):
        run.start(f"worker{task}", [PY, PROGRAM], {**env, "DMLC_TASK_ID": str(task)}, workdir)


def upstream(run: Run, workdir: str, port: int, workers: int = 2, **extra: str) -> None:
    env = base_env(workdir, port, workers, MODE="upstream", **extra)
    for task in range(workers):
        run.start(f"worker{task}", [PY, PROGRAM], {**env, "DMLC_TASK_ID": str(task)}, workdir)


def one(root: str, name: str, starter, cap: float, **extra: str) -> tuple[Run, str]:
    workdir = tempfile.mkdtemp(prefix=f"{name}-", dir=root)
    run = Run(started=time.time())
    starter(run, workdir, free_port(), **extra)  # a fresh port: a tracker cannot bind one in TIME_WAIT
    run.wait_all(cap)
    run.kill()
    return run, workdir


def launch_figures(root: str, repeat: int, rounds: int) -> None:
    sides = {
        "launcher": lambda run, w, p: launcher_pods(run, w, p, ROUNDS=str(rounds)),
        "by hand, at once": lambda run, w, p: by_hand(run, w, p, False, ROUNDS=str(rounds)),
        "by hand, tracker first": lambda run, w, p: by_hand(run, w, p, True, ROUNDS=str(rounds)),
        "by hand + floor": lambda run, w, p: by_hand(run, w, p, True, floor=True, ROUNDS=str(rounds)),
    }
    walls: dict[str, list[float]] = {side: [] for side in sides}
    for i in range(repeat):
        for side, starter in sides.items():
            run, workdir = one(root, side.replace(" ", "-").replace(",", ""), starter, RUN_TIMEOUT)
            ok = all(p.code == 0 for p in run.procs) and models_agree(workdir)
            if not ok:
                raise SystemExit(f"{side} run {i + 1} failed: exit codes {[p.code for p in run.procs]}, "
                                 f"logs in {workdir}")
            walls[side].append(run.end() - run.started)
            say(f"  launch {i + 1}/{repeat} {side:24s} {walls[side][-1]:.3f} s")
    medians = {side: statistics.median(values) for side, values in walls.items()}
    baseline_side = min(("by hand, at once", "by hand, tracker first"), key=medians.get)
    ratio = medians["launcher"] / medians[baseline_side]
    say()
    say(f"| launch, 2 pods x 1 worker, {rounds} rounds | median of {repeat} (s) | runs (s) |")
    say("|---|---:|---|")
    for side, values in walls.items():
        say(f"| {side} | {medians[side]:.3f} | {', '.join(f'{v:.2f}' for v in values)} |")
    say(f"\nlaunch ratio launcher / {baseline_side}: {ratio:.3f} (goal <= {GOAL:.2f}: "
        f"{'met' if ratio <= GOAL else 'NOT met'})")
    say(f"launch ratio launcher / by hand + floor: {medians['launcher'] / medians['by hand + floor']:.3f} "
        "(the launcher's own cost, beyond the pydantic-settings import every launcher pays)")
    floor_ratio = medians["launcher"] / medians["by hand + floor"]
    record(
        "xgboost-launch", f"XGBoost launch, 2 pods x 1 worker, {rounds} rounds, against the same job by hand",
        [f"launch, 2 pods x 1 worker, {rounds} rounds", f"median of {repeat} (s)", "runs (s)", "launcher / this"],
        [[side, f"{medians[side]:.3f}", ", ".join(f"{v:.2f}" for v in values),
          f"{medians['launcher'] / medians[side]:.3f}"] for side, values in walls.items()], [1, 3],
        versions={"xgboost": xgboost_version()},
        plot={"title": f"XGBoost launch, 2 pods, {rounds} rounds: seconds (ratio to by hand + floor "
              f"{floor_ratio:.3f})", "unit": "s", "bars": [[side, medians[side]] for side in walls]})


def failure_figures(root: str, repeat: int, cap: float, pods: int) -> None:
    rows = []
    sides = {
        "launcher": launcher_pods,
        "by hand": lambda run, w, p, **e: by_hand(run, w, p, True, **e),
        "upstream example": upstream,
    }
    for fail_task, how in (("1", "exit"), ("1", "abrupt"), ("0", "abrupt")):
        what = f"task {fail_task} {'sys.exit(3)' if how == 'exit' else 'os._exit(3)'}"
        for side, starter in sides.items():
            reactions, codes = [], []
            for _ in range(repeat):
                run, workdir = one(root, "fail", starter, cap, workers=pods, FAIL_TASK=fail_task, FAIL_HOW=how,
                                   ROUNDS="100000")
                failed_at_path = os.path.join(workdir, "failed_at")
                if not os.path.exists(failed_at_path):
                    raise SystemExit(f"{side}, {what}: the failing task never recorded its failure; logs in {workdir}")
                failed_at = float(open(failed_at_path).read())
                capped = any(p.code is None or p.code == -signal.SIGKILL for p in run.procs)
                reactions.append(cap - (failed_at - run.started) if capped else run.end() - failed_at)
                codes.append(",".join("capped" if p.code in (None, -signal.SIGKILL) else str(p.code) for p in run.procs))
                say(f"  failure {what:18s} {side:17s} {reactions[-1]:7.3f} s  exit codes {codes[-1]}")
            rows.append((what, side, statistics.median(reactions), max(reactions),
                         sum(c.count("capped") > 0 for c in codes), codes))
    say()
    header = [f"{pods} pods x 1 worker; one exits 3", "side", "median s until every process is gone", "worst s",
              f"runs capped at {cap:g} s", "exit codes (pod/task order, each run)"]
    table = [[what, side, f"{median:.3f}", f"{worst:.3f}", f"{capped}/{len(codes)}", "; ".join(codes)]
             for what, side, median, worst, capped, codes in rows]
    say(markdown(header, table, [2, 3, 4]))
    record("xgboost-failure", f"XGBoost, {pods} pods x 1 worker, one task exits 3: until every process is gone",
           header, table, [2, 3, 4], versions={"xgboost": xgboost_version()})
    ours = {what: median for what, side, median, *_ in rows if side == "launcher"}
    for what, side, median, *_ in rows:
        if side != "launcher":
            say(f"ratio launcher / {side}, {what}: {ours[what] / median:.3f}")


def xgboost_version() -> str:
    import xgboost  # its distribution is xgboost or xgboost-cpu: the module knows its version

    return xgboost.__version__


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--fail-cap", type=float, default=30.0)
    parser.add_argument("--fail-pods", type=int, default=3)
    parser.add_argument("--only", choices=["launch", "failure"], default=None, help="run one of the two")
    args = parser.parse_args()
    import xgboost
    # The launcher's bytecode, as pip install leaves it in an image (PYTHONDONTWRITEBYTECODE=1
    # would otherwise have every launcher compile it from source, a cost no installed copy pays).
    compileall.compile_dir(os.path.join(REPO, "launcher"), quiet=1)

    say(f"xgboost {xgboost.__version__}, python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f}")
    root = tempfile.mkdtemp(prefix="bench-xgboost-")
    try:
        if args.only != "failure":
            launch_figures(root, args.repeat, args.rounds)
            say()
        if args.only != "launch":
            failure_figures(root, args.repeat, args.fail_cap, args.fail_pods)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
