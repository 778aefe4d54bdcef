"""An MPI training loop that checkpoints every step and resumes from its checkpoint (the shape of
resume.py, over mpi4py): rank 0 saves the step and the weights, every rank loads them at start.
One allreduce a step.

CKPT        the checkpoint file (default: none, so no resume)
STEPS       how many steps the job has (default 8)
FAIL        <ending>@<step>[@<generations>]: the rank FAIL_RANK ends so at that step, in the given
            generations (comma-separated; default 0: only the first start), where the generation is
            what the launcher tells the rank (LAUNCHER_RESTART_COUNT). <ending>: exit:<code> |
            signal:<NAME>
FAIL_RANK   the rank that fails in generation 0 (default 1); in generation g, the next g-th rank
            (FAIL_RANK + g modulo the world's size), so that each generation's failure is its own
REPORT_DIR  each rank appends "<generation> <step>" per step done to <rank>.steps
HANG        <step>[@<generations>]: the failing rank (FAIL_RANK's, as for FAIL) stops at that step, for good
PROGRESS    1: every rank prints its progress as Katib's "step=N" lines
PAUSE       seconds each step takes (default 0), so a job outlasts what a test does to it
"""

import json
import os
import time

from mpi4py import MPI
from restart_fault import FAIL, HANG, progress

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
generation = int(os.environ.get("LAUNCHER_RESTART_COUNT", "0"))
checkpoint = os.environ.get("CKPT")
steps = int(os.environ.get("STEPS", "8"))
report_dir = os.environ.get("REPORT_DIR")
fail_rank = int(os.environ.get("FAIL_RANK", "1"))
pause = float(os.environ.get("PAUSE", "0"))


start, weight = 0, 0.0
if checkpoint and os.path.exists(checkpoint):
    with open(checkpoint) as handle:
        saved = json.load(handle)
    start, weight = saved["step"] + 1, saved["weight"]
for step in range(start, steps):
    if rank == (fail_rank + generation) % comm.Get_size() and FAIL.due(step, generation):
        FAIL.end()
    if rank == (fail_rank + generation) % comm.Get_size() and HANG.due(step, generation):
        HANG.end()
    time.sleep(pause)
    weight += comm.allreduce(1.0) / comm.Get_size()
    if report_dir:
        with open(os.path.join(report_dir, f"{rank}.steps"), "a") as log:
            log.write(f"{generation} {step}\n")
    if rank == 0 and checkpoint:
        with open(checkpoint + ".tmp", "w") as handle:
            json.dump({"step": step, "weight": weight}, handle)
        os.replace(checkpoint + ".tmp", checkpoint)
    comm.Barrier()  # the checkpoint of this step is down before any rank goes on
    progress(step)
# Every step added 1 to the weight: a resumed job that lost or repeated a step says so.
if rank == 0:
    print(f"done: {steps} steps, weight {weight:g}", flush=True)
    assert weight == steps, f"weight {weight} after {steps} steps"
