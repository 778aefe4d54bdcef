"""Benchmark rank: init + barrier, then write $BENCH_DIR/rank<N>.pid and sleep.
With IGNORE_TERM=1 the rank ignores SIGTERM (SIG_IGN) from its start."""

import os
import signal
import time

if os.environ.get("IGNORE_TERM") == "1":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)

import torch.distributed as dist

bench_dir = os.environ["BENCH_DIR"]
rank = int(os.environ["RANK"])
dist.init_process_group("gloo")
dist.barrier()
path = os.path.join(bench_dir, f"rank{rank}.pid")
with open(path + ".tmp", "w") as handle:
    handle.write(str(os.getpid()))
os.replace(path + ".tmp", path)
time.sleep(300)
