"""Ranks in a training loop, an all-reduce a step, where one rank ends the way the test asks while
the others go on (they meet its end in their next collective, as gloo's "Connection closed by peer"):

ENDING     exit:<code> | signal:<NAME> (the rank sends itself the signal) | oom (it allocates, and
           touches, memory until the kernel's OOM killer takes it) | fault (it prints an NCCL system
           error, as a rank on a broken node does, and exits 1) | none (every rank trains to the end)
FAIL_RANK  the global rank that ends so (default 1)
AT_STEP    the step it ends at (default 3)
STEPS      how many steps the job has (default 400: the others are mid-training when it ends)
REPORT_DIR each rank writes <rank>.step (atomically) once it has done its first step, so a test can
           wait until the job trains before it acts
"""

import gc
import os
import signal
import sys
import time

gc.disable()  # the collector paused over the imports (README.md: CI time)
import torch
import torch.distributed as dist

gc.freeze()
gc.enable()

rank = int(os.environ["RANK"])
ending = os.environ.get("ENDING", "none")
fail_rank = int(os.environ.get("FAIL_RANK", "1"))
at_step = int(os.environ.get("AT_STEP", "3"))
steps = int(os.environ.get("STEPS", "400"))
report_dir = os.environ.get("REPORT_DIR")


def end() -> None:
    how, _, what = ending.partition(":")
    if how == "exit":
        sys.exit(int(what))
    if how == "signal":
        os.kill(os.getpid(), signal.Signals[what])
        time.sleep(60)  # a signal the process handles or ignores ends nothing: the test then fails
    if how == "oom":
        hoard = []
        while True:
            hoard.append(bytearray(b"\x01") * (32 << 20))
    if how == "fault":
        print("NCCL error in: ProcessGroupNCCL.cpp:2050, unhandled system error", file=sys.stderr, flush=True)
        sys.exit(1)


dist.init_process_group("gloo")
weights = torch.ones(256)
for step in range(steps):
    dist.all_reduce(weights)
    weights /= dist.get_world_size()
    if step == 0 and report_dir:
        path = os.path.join(report_dir, f"{rank}.step")
        with open(path + ".tmp", "w") as handle:
            handle.write(str(os.getpid()))
        os.replace(path + ".tmp", path)
    if rank == fail_rank and step == at_step:
        end()
    time.sleep(0.005)
dist.destroy_process_group()
print(f"rank {rank} trained {steps} steps", flush=True)
