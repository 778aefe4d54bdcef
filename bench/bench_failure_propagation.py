#!/usr/bin/env python3
"""How long a 2-node torch job takes to end after one rank on one node dies.

Run from the repository root:

    python3 bench/bench_failure_propagation.py [--repeat 5] [--baseline-repeat 1]

Two "nodes" (two processes with Trainer's PET_* env, static rendezvous on 127.0.0.1, one gloo
rank each). Rank 1 (node 1) exits 3 after init; rank 0 (node 0) has already finished, so node 0's
torchrun waits in its exit barrier. Measured, with each node's exit code:
- from the failing rank's recorded time.time() just before it exits until every node's process has
  exited (this includes the failing rank's own interpreter shutdown, the same on both sides);
- from the failing node's process exit until the other node's (the propagation alone).

- launcher: each node runs ``python3 -m launcher torch -- PROGRAM``.
- baseline: each node runs ``python3 -m torch.distributed.run`` with the same flags (what the
  Kubeflow SDK's Kubernetes backend runs through plain torchrun): node 0 sits in torchrun's exit
  barrier for its full 300 s timeout, then exits 0. One baseline run by default (it is 300 s).

Runs are interleaved (launcher, baseline, launcher, ...) until the baseline runs are done.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_torch import fmt, markdown_table, median, say  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAM = os.path.join(REPO, "tests", "programs", "ranks.py")
PY = sys.executable
CAP = 400.0  # longer than torchrun's 300 s exit barrier: a run past this is a hang


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def node_env(rank: int, port: int, workdir: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "LAUNCHER_", "TORCHELASTIC_"))}
    env.update(PYTHONPATH=REPO, OMP_NUM_THREADS="1", PET_NNODES="2", PET_NPROC_PER_NODE="1", PET_NODE_RANK=str(rank),
               PET_MASTER_ADDR="127.0.0.1", PET_MASTER_PORT=str(port), HOSTNAME=f"bench-node-0-{rank}",
               REPORT_DIR=workdir, BEHAVIOUR="exit:3", FAIL_RANK="1", OTHERS="finish",
               LAUNCHER_TERMINATION_LOG=os.path.join(workdir, f"termination-{rank}.json"))
    return env


def argv(side: str, rank: int, port: int) -> list[str]:
    if side == "launcher":
        return [PY, "-m", "launcher", "torch", "--", PROGRAM]
    return [PY, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(rank),
            "--rdzv-backend", "static", "--master-addr", "127.0.0.1", "--master-port", str(port), PROGRAM]


def run(side: str, root: str, index: int) -> tuple[float | None, float | None, list[int | None]]:
    workdir = os.path.join(root, f"{side}-{index}")
    os.makedirs(workdir)
    port = free_port()
    procs = {}
    for rank in (1, 0):
        with open(os.path.join(workdir, f"node{rank}.log"), "wb") as log:
            procs[rank] = subprocess.Popen(argv(side, rank, port), env=node_env(rank, port, workdir), cwd=REPO,
                                           stdout=log, stderr=subprocess.STDOUT)
    exited: dict[int, float] = {}
    codes: dict[int, int | None] = {}
    end = time.monotonic() + CAP
    while len(exited) < 2 and time.monotonic() < end:
        for rank, proc in procs.items():
            if rank not in exited and proc.poll() is not None:
                exited[rank], codes[rank] = time.time(), proc.returncode
        time.sleep(0.01)
    for rank, proc in procs.items():
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    died_file = os.path.join(workdir, "1.died")
    if len(exited) < 2 or not os.path.exists(died_file):
        return None, None, [codes.get(0), codes.get(1)]
    with open(died_file) as handle:
        died = float(handle.read())
    return max(exited.values()) - died, exited[0] - exited[1], [codes[0], codes[1]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5, help="launcher runs (default 5)")
    parser.add_argument("--baseline-repeat", type=int, default=1, help="plain torchrun runs, 300 s each (default 1)")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="bench-propagation-")
    results: dict[str, list[tuple[float | None, float | None, list]]] = {"launcher": [], "baseline": []}
    for index in range(max(args.repeat, args.baseline_repeat)):
        for side, count in (("launcher", args.repeat), ("baseline", args.baseline_repeat)):
            if index < count:
                seconds, spread, codes = run(side, root, index)
                results[side].append((seconds, spread, codes))
                say(f"{side} run {index + 1}: every node gone {fmt(seconds)} s after rank 1 died, node 0 "
                    f"{fmt(spread)} s after node 1; exit codes node 0 / node 1: {codes[0]} / {codes[1]}")
    medians = {side: median([s for s, _, _ in runs if s is not None]) for side, runs in results.items()}
    spreads = {side: median([s for _, s, _ in runs if s is not None]) for side, runs in results.items()}
    say()
    markdown_table(
        ["side", "runs", "median: rank 1 died -> every node exited", "median: node 1 exited -> node 0 exited",
         "exit codes (node 0 / node 1)"],
        [[label, str(len(results[side])), f"{fmt(medians[side])} s", f"{fmt(spreads[side])} s",
          ", ".join(f"{c[0]}/{c[1]}" for _, _, c in results[side])]
         for side, label in (("launcher", "launcher"), ("baseline", "plain torchrun (baseline)")) if results[side]],
        range(1, 4), record_as="failure-propagation",
        title="Two nodes, rank 1 on node 1 exits 3: until every node exited, against plain torchrun",
        plot={"title": "rank 1 on node 1 exits 3: seconds until every node exited", "unit": "s",
              "bars": [[label, medians[side]] for side, label in (("launcher", "launcher"), ("baseline", "torchrun"))
                       if medians[side] is not None]})
    ours, theirs = medians["launcher"], medians["baseline"]
    if ours and theirs:
        say(f"\nratio launcher / torchrun: {ours / theirs:.4f} ({theirs / ours:.0f}x sooner)")
    say(f"(logs in {root})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
