"""A training loop that checkpoints every step and resumes from its checkpoint, the shape of the
elastic examples users copy: rank 0 saves the step and the weights, every rank loads them at start.
One all-reduce a step over gloo.

CKPT        the checkpoint file (default: none, so no resume)
STEPS       how many steps the job has (default 12)
FAIL        <ending>@<step>[@<generations>]: the rank FAIL_RANK ends so at that step, in the given
            generations (comma-separated; default 0: only the first start), where the generation is
            what torch tells the rank (TORCHELASTIC_RESTART_COUNT). <ending>: exit:<code> |
            signal:<NAME>
FAIL_RANK   the global rank that fails (default 1)
HANG        <step>[@<generations>]: the rank FAIL_RANK stops at that step, for good (default: never)
PROGRESS    1: every rank prints its progress as Katib's "step=N" lines
STEP_TIME   seconds each step sleeps (default 0.05)
REPORT_DIR  each rank appends "<generation> <step> <launcher's restart count>" per step done to
            <rank>.steps, and writes <rank>.first-<generation> (atomically, the wall time of its
            first step in that generation) so a test can wait for a generation to train, and
            <rank>.fault-<generation> (the wall time it fails at, FAIL)
"""

import gc
import os
import time

gc.disable()  # the collector paused over the imports (README.md: CI time)
import torch
import torch.distributed as dist
from restart_fault import FAIL, HANG, progress

gc.freeze()
gc.enable()

rank = int(os.environ["RANK"])
generation = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
launcher_count = os.environ.get("LAUNCHER_RESTART_COUNT", "-")
checkpoint = os.environ.get("CKPT")
steps = int(os.environ.get("STEPS", "12"))
step_time = float(os.environ.get("STEP_TIME", "0.05"))
report_dir = os.environ.get("REPORT_DIR")
fail_rank = int(os.environ.get("FAIL_RANK", "1"))


def atomic(path: str, text: str) -> None:
    with open(path + ".tmp", "w") as handle:
        handle.write(text)
    os.replace(path + ".tmp", path)


dist.init_process_group("gloo")
start, weights = 0, torch.zeros(64)
if checkpoint and os.path.exists(checkpoint):
    saved = torch.load(checkpoint)
    start, weights = saved["step"] + 1, saved["weights"]
for step in range(start, steps):
    if rank == fail_rank and FAIL.due(step, generation):
        if report_dir:
            atomic(os.path.join(report_dir, f"{rank}.fault-{generation}"), repr(time.time()))
        FAIL.end()
    if rank == fail_rank and HANG.due(step, generation):
        HANG.end()
    update = torch.ones(64)
    dist.all_reduce(update)
    weights += update / dist.get_world_size()
    if report_dir:
        if step == start:
            atomic(os.path.join(report_dir, f"{rank}.first-{generation}"), repr(time.time()))
        with open(os.path.join(report_dir, f"{rank}.steps"), "a") as log:
            log.write(f"{generation} {step} {launcher_count}\n")
    progress(step)
    if rank == 0 and checkpoint:
        torch.save({"step": step, "weights": weights}, checkpoint + ".tmp")
        os.replace(checkpoint + ".tmp", checkpoint)
    dist.barrier()  # the checkpoint of this step is down before any rank goes on
    time.sleep(step_time)
# Every step added 1 to each weight: a resumed job that lost or repeated a step says so.
if rank == 0:
    print(f"done: {steps} steps, weights {weights[0].item():g}", flush=True)
    assert weights[0].item() == steps, f"weights {weights[0].item()} after {steps} steps"
dist.destroy_process_group()
