"""``accelerate launch`` lines on one pod of a TrainJob of 2 nodes x 2 CPU processes: what Accelerate
alone would start there, and what ``trainer-launcher torch --accelerate`` runs.

    python -m tests.accelerate_table     the table in docs/frameworks/accelerate.md (each line read by
                                         the real accelerate)

The world each side gets is read from ``plan`` (ours) and from Accelerate's own reading of the
line (alone: it reads no PET_*). tests/test_accelerate.py checks every row.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIG = str(REPO / "tests" / "fixtures" / "accelerate_cpu.yaml")
# Trainer's env for pod 1 of 2 nodes x 2 processes (no GPU here).
TRAINER_ENV = {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "2", "PET_NODE_RANK": "1",
               "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": "29500"}
# (line, the world we run: nodes, processes per node) - the user's setting wins where there is one.
LINES: tuple[tuple[str, tuple[int, int]], ...] = (
    ("train.py", (2, 2)),
    ("--cpu train.py", (2, 2)),
    ("--num_processes 4 train.py", (2, 2)),
    ("--num_processes 2 train.py", (2, 1)),
    ("--multi_gpu --num_processes 4 train.py", (2, 2)),
    ("--num_machines 2 --num_processes 8 train.py", (2, 4)),
    ("--num_processes 4 --mixed_precision bf16 train.py", (2, 2)),
    ("--config_file tests/fixtures/accelerate_cpu.yaml train.py", (2, 2)),
    ("--config_file tests/fixtures/accelerate_cpu.yaml --num_processes 8 train.py", (2, 4)),
    ("--main_process_port 29612 train.py", (2, 2)),
    ("--machine_rank 1 --num_machines 2 --main_process_ip 10.0.0.5 train.py", (2, 2)),
    ("--max_restarts 2 --rdzv_backend c10d train.py", (2, 2)),
    ("-m pkg.train --lr 1e-4", (2, 2)),
)


def plan(line: str, python: str = sys.executable, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    import os

    run_env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "LAUNCHER_"))}
    run_env.update(PYTHONPATH=str(REPO), **TRAINER_ENV, **(env or {}))
    return subprocess.run([python, "-m", "launcher", "plan", "--accelerate", "--", *line.split()], env=run_env,
                          cwd=REPO, capture_output=True, text=True, timeout=300, check=False)


def row(line: str) -> dict:
    result = plan(line)
    if result.returncode:
        raise RuntimeError(f"plan failed for {line!r}: {result.stderr}")
    document = json.loads(result.stdout)
    return {"line": line, "nodes": int(document["nnodes"]), "nproc": document["nprocPerNode"],
            "node_rank": document["nodeRank"], "argv": document["argv"], "alone": document["accelerate"]["alone"],
            "notes": document["accelerate"]["notes"]}


def alone_text(alone: dict) -> str:
    if alone.get("error"):
        return f"fails: {alone['error']}"
    if alone["world"] <= 1:
        return "1 process, a world of 1 on each pod"
    machines = alone["machines"]
    if machines == 1:
        return f"{alone['processes']} processes, a world of {alone['world']} on each pod (every pod its own job)"
    return f"{alone['processes']} processes, waits for {machines} machines, rank 0 on every pod"


def main() -> int:
    print("| `accelerate launch ...` | Accelerate alone | trainer-launcher |")
    print("|---|---|---|")
    for line, _ in LINES:
        found = row(line)
        ours = f"{found['nodes']} x {found['nproc']} = world {found['nodes'] * found['nproc']}, node rank {found['node_rank']}"
        print(f"| `{line}` | {alone_text(found['alone'])} | {ours} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
