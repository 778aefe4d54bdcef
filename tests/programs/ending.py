"""A rank that does real gloo work and ends the way the test asks, through environment variables:

END_BARRIER  1: a dist.barrier() after the last all-reduce
END_DESTROY  1: dist.destroy_process_group() before exiting; 0: exit holding the group, at once
             (os._exit: a gloo rank whose process exits normally holding one may abort in its
             threads' destructors, torch's own SIGABRT; its store connection closes either way)
END_SLEEP    seconds a rank on node 1 (GROUP_RANK 1) sleeps after its last collective, so that
             node finishes a moment after node 0
REPORT_DIR   each rank writes <rank>.end (the time, in epoch seconds) as the last thing it does
"""

import gc
import os
import time

gc.disable()  # the collector paused over the imports (README.md: CI time)
import torch
import torch.distributed as dist

gc.freeze()
gc.enable()

rank = int(os.environ["RANK"])
node = int(os.environ["GROUP_RANK"])
report_dir = os.environ["REPORT_DIR"]

dist.init_process_group("gloo")
total = torch.zeros(1)
for step in range(5):
    value = torch.tensor([float(rank + step)])
    dist.all_reduce(value)
    total += value
if os.environ.get("END_BARRIER") == "1":
    dist.barrier()
if node == 1:
    time.sleep(float(os.environ.get("END_SLEEP", "0")))
if os.environ.get("END_DESTROY", "1") == "1":
    dist.destroy_process_group()
print(f"rank {rank} done: {total.item()}", flush=True)
with open(os.path.join(report_dir, f".{rank}.end.tmp"), "w") as handle:
    handle.write(repr(time.time()))
os.replace(os.path.join(report_dir, f".{rank}.end.tmp"), os.path.join(report_dir, f"{rank}.end"))
if os.environ.get("END_DESTROY", "1") != "1":
    os._exit(0)
