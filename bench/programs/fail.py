"""Benchmark rank: after init + barrier, rank 1 records time.time() in $BENCH_DIR/failed_at and
exits 3; rank 0 sleeps until it is torn down. Every rank writes $BENCH_DIR/rank<N>.pid first."""

import os
import sys
import time

import torch.distributed as dist

bench_dir = os.environ["BENCH_DIR"]
rank = int(os.environ["RANK"])


def write(name: str, text: str) -> None:
    path = os.path.join(bench_dir, name)
    with open(path + ".tmp", "w") as handle:
        handle.write(text)
    os.replace(path + ".tmp", path)


write(f"rank{rank}.pid", str(os.getpid()))
dist.init_process_group("gloo")
dist.barrier()
if rank == 1:
    time.sleep(0.3)  # let rank 0 settle into its sleep and the supervisors into their loops
    write("failed_at", repr(time.time()))
    sys.exit(3)
time.sleep(120)
