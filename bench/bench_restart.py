#!/usr/bin/env python3
"""How long a 2-node torch job takes to train again after one rank is killed, restarted in place.

Run from the repository root:

    python3 bench/bench_restart.py [--repeat 5] [--baseline-repeat 10]

Two "pods" (two processes with Trainer's PET_* env on 127.0.0.1), two gloo ranks each, running
tests/programs/resume.py: a loop that checkpoints every step and resumes from the checkpoint. Rank 1
is SIGKILLed at step 5 of the first start (137, retryable). Measured per run, wall clock, from the
files the ranks write:

- cold start: the pods' launch -> the last rank's first step (what every fresh start pays);
- recovery: the kill -> the last rank's first step after it.

Sides, interleaved run by run:

- in place: `trainer-launcher torch -- --max-restarts 2`: every pod restarts its ranks itself;
- torchrun c10d (baseline): plain `torchrun --rdzv-backend c10d --max-restarts 2` on each pod, what
  users reach for; a run that does not finish within CAP (60) seconds counts as not finished;
- full path: the pods run without restarts (every pod exits 137, as for a JobSet restart), then
  two new pods start from nothing and resume from the checkpoint (no scheduling, image pull or
  initializers counted: a floor for what Kubernetes does);
- pod replaced: `--max-restarts 2` again, but instead of one rank, every process of pod 1 is
  SIGKILLed once every rank has stepped 5 times (a lost machine), and a new pod 1 starts from
  nothing at once (Kubernetes' replacement taken as free); it rejoins the restart the pod that
  remains holds for (the job's lobby, launcher/core/lobby.py). Recovery is the kill -> every
  rank stepping again.

The ratio printed is recovery in place / the cold start of the same job without restarts (the
full path's first start): with restarts on, the first start also pays the next generation's agent
and ranks importing torch beside it, which its own cold start column shows.
"""

from __future__ import annotations

import argparse
import glob
import os
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_torch import fmt, markdown_table, median, say  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAM = os.path.join(REPO, "tests", "programs", "resume.py")
PY = sys.executable
CAP = 60.0  # the job takes about 10 s here: a run past this is hung
SIDES = ("in-place", "torchrun", "full", "replaced")
LABELS = {"in-place": "in place (launcher)", "torchrun": "torchrun c10d --max-restarts", "full": "full path",
          "replaced": "pod replaced (launcher)"}
LOST_AT = 5  # the step every rank has reached when pod 1 is lost


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def pod_env(node: int, port: int, workdir: str, reports: str, fail: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "LAUNCHER_", "TORCHELASTIC_"))}
    env.update(PYTHONPATH=REPO, PET_NNODES="2", PET_NPROC_PER_NODE="2", PET_NODE_RANK=str(node),
               PET_MASTER_ADDR="127.0.0.1", PET_MASTER_PORT=str(port), HOSTNAME=f"bench-node-0-{node}",
               CKPT=os.path.join(workdir, "checkpoint.pt"), STEPS="12", REPORT_DIR=reports,
               LAUNCHER_TERMINATION_LOG=os.path.join(reports, f"termination-{node}.json"))
    if fail:
        env.update(FAIL="signal:SIGKILL@5", FAIL_RANK="1")
    return env


def argv(side: str, node: int, port: int) -> list[str]:
    if side in ("in-place", "replaced"):
        return [PY, "-m", "launcher", "torch", "--grace-period", "5", "--", "--max-restarts", "2", PROGRAM]
    if side == "full":
        return [PY, "-m", "launcher", "torch", "--grace-period", "5", "--", PROGRAM]
    return [PY, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "bench", "--max-restarts", "2", PROGRAM]


def start(side: str, workdir: str, reports: str, port: int, fail: bool, nodes=(1, 0)) -> list[subprocess.Popen]:
    os.makedirs(reports, exist_ok=True)
    procs = []
    for node in nodes:
        with open(os.path.join(reports, f"node{node}-{time.time():.3f}.log"), "wb") as log:
            procs.append(subprocess.Popen(argv(side, node, port), env=pod_env(node, port, workdir, reports, fail),
                                          cwd=REPO, stdout=log, stderr=subprocess.STDOUT))
    return procs


def steps_done(reports: str, rank: int) -> int:
    try:
        with open(os.path.join(reports, f"{rank}.steps")) as handle:
            return len(handle.read().split()) // 3
    except OSError:
        return 0


def lose_and_replace(workdir: str, reports: str, port: int, procs: list[subprocess.Popen], deadline: float) -> float:
    """Once every rank has done LOST_AT steps, SIGKILL every process of pod 1 (procs[0]) and start its
    replacement at once; the kill's time (0.0: the job ended first)."""
    import psutil

    while any(steps_done(reports, rank) < LOST_AT for rank in range(4)):
        if time.time() > deadline or any(p.poll() is not None for p in procs):
            return 0.0
        time.sleep(0.02)
    pod = psutil.Process(procs[0].pid)
    everyone = [pod, *pod.children(recursive=True)]
    lost = time.time()
    for process in everyone:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    procs[0].wait()
    procs[0] = start("replaced", workdir, reports, port, fail=False, nodes=(1,))[0]
    return lost


def wait(procs: list[subprocess.Popen], deadline: float) -> list[int | None]:
    while any(p.poll() is None for p in procs) and time.time() < deadline:
        time.sleep(0.05)
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return [p.returncode for p in procs]


def times(reports: str, pattern: str) -> list[float]:
    found = []
    for path in glob.glob(os.path.join(reports, pattern)):
        with open(path) as handle:
            found.append(float(handle.read()))
    return found


def run(side: str, root: str, index: int) -> tuple[float | None, float | None, str]:
    """(cold start, recovery, what happened) of one run."""
    workdir = os.path.join(root, f"{side}-{index}")
    first = os.path.join(workdir, "first")
    launched, port = time.time(), free_port()
    procs = start(side, workdir, first, port, fail=side != "replaced")
    faults = [lose_and_replace(workdir, first, port, procs, launched + CAP)] if side == "replaced" else []
    codes = wait(procs, launched + CAP)
    starts = times(first, "*.first-0")
    cold = max(starts) - launched if len(starts) == 4 else None
    faults = [f for f in faults if f] or times(first, "1.fault-0")
    if not faults:
        return cold, None, f"no fault (exit codes {codes})"
    if side == "full":
        # Kubernetes' way, at its fastest: new pods start from nothing once the old ones are gone.
        second = os.path.join(workdir, "second")
        codes += wait(start(side, workdir, second, free_port(), fail=False), time.time() + CAP)
        again = times(second, "*.first-0")
    else:
        again = times(first, "*.first-[1-9]")
    finished = all(code == 0 for code in codes[-2:])
    recovery = max(again) - faults[0] if len(again) >= 4 and finished else None
    return cold, recovery, "finished" if finished else f"did not finish (exit codes {codes})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5, help="runs in place, full-path and pod-replaced runs (default 5)")
    parser.add_argument("--baseline-repeat", type=int, default=10, help="torchrun c10d runs (default 10)")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="bench-restart-")
    results: dict[str, list[tuple[float | None, float | None, str]]] = {side: [] for side in SIDES}
    counts = {"in-place": args.repeat, "torchrun": args.baseline_repeat, "full": args.repeat, "replaced": args.repeat}
    for index in range(max(counts.values())):
        for side in SIDES:
            if index < counts[side]:
                cold, recovery, what = run(side, root, index)
                results[side].append((cold, recovery, what))
                say(f"{side} run {index + 1}: cold start {fmt(cold)} s, recovery {fmt(recovery)} s: {what}")
    colds = {side: median([c for c, _, _ in runs if c is not None]) for side, runs in results.items()}
    recoveries = {side: median([r for _, r, _ in runs if r is not None]) for side, runs in results.items()}
    say()
    rows = []
    for side in SIDES:
        runs = results[side]
        if not runs:
            continue
        finished = sum(1 for _, r, _ in runs if r is not None)
        # Against the cold start of the same job without restarts (the full path's first start): the
        # in-place side's own first start also imports the next generation's agent and ranks.
        plain = colds["full"]
        ratio = recoveries[side] / plain if recoveries[side] and plain else None
        rows.append([LABELS[side], f"{finished} of {len(runs)}", f"{fmt(colds[side])} s", f"{fmt(recoveries[side])} s",
                     f"{ratio:.2f}" if ratio else "-"])
    markdown_table(
        ["side", "finished", "median cold start", "median recovery (kill -> every rank stepping)",
         "recovery / cold start without restarts"],
        rows, range(1, 5), record_as="restart",
        title="Two pods x two gloo ranks, rank 1 SIGKILLed at step 5: recovery against a cold start",
        plot={"title": "rank 1 killed, or pod 1 lost: seconds until every rank steps again", "unit": "s",
              "bars": [[LABELS[side], recoveries[side]] for side in SIDES if recoveries[side] is not None]
              + ([["cold start", colds["full"]]] if colds["full"] is not None else [])})
    ours, cold, replaced = recoveries["in-place"], colds["full"], recoveries["replaced"]
    if ours and cold:
        say(f"\nratio recovery in place / cold start without restarts: {ours / cold:.2f}")
    if replaced and recoveries["full"]:
        say(f"ratio recovery of a replaced pod / the full path's: {replaced / recoveries['full']:.2f}")
    say(f"(logs in {root})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
