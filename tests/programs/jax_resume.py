"""A JAX training loop that checkpoints every step and resumes from its checkpoint (the shape of
resume.py, torch's): process 0 saves the step and the weight, every process loads them at start.
One cross-process allgather a step (gloo on CPU).

CKPT        the checkpoint file (default: none, so no resume)
STEPS       how many steps the job has (default 8)
FAIL        <ending>@<step>[@<generations>]: process FAIL_ID ends so at that step, in the given
            generations (comma-separated; default 0: only the first start), where the generation is
            the launcher's restart count (LAUNCHER_RESTART_COUNT). <ending>: exit:<code> |
            signal:<NAME>
FAIL_ID     the process that fails (default 1)
HANG        <step>[@<generations>]: process FAIL_ID stops at that step, for good (default: never)
PROGRESS    1: every process prints its progress as Katib's "step=N" lines
STEP_TIME   seconds each step sleeps (default 0)
REPORT_DIR  each process appends "<generation> <step> <coordinator>" per step done to
            <process id>.steps (the coordinator: JAX_COORDINATOR_ADDRESS as the process saw it), and
            writes <process id>.first-<generation> (atomically, once its first step in that
            generation is done and checkpointed) so a test can wait for a generation to train
"""

import gc
import json
import os
import time

gc.disable()  # the collector paused over the imports (README.md: CI time)
import jax
import jax.numpy as jnp
from jax.experimental import multihost_utils
from restart_fault import FAIL, HANG, progress

gc.freeze()
gc.enable()

generation = int(os.environ["LAUNCHER_RESTART_COUNT"])
checkpoint = os.environ.get("CKPT")
steps = int(os.environ.get("STEPS", "8"))
report_dir = os.environ.get("REPORT_DIR")
fail_id = int(os.environ.get("FAIL_ID", "1"))
step_time = float(os.environ.get("STEP_TIME", "0"))


jax.distributed.initialize()
me = jax.process_index()
start, weight = 0, 0.0
if checkpoint and os.path.exists(checkpoint):
    with open(checkpoint) as handle:
        saved = json.load(handle)
    start, weight = saved["step"] + 1, saved["weight"]
for step in range(start, steps):
    if me == fail_id and FAIL.due(step, generation):
        FAIL.end()
    if me == fail_id and HANG.due(step, generation):
        HANG.end()
    # Each process adds its share; the sum over the world is 1 a step.
    gathered = multihost_utils.process_allgather(jnp.array(1.0 / jax.process_count()))
    weight += float(gathered.sum())
    if report_dir:
        with open(os.path.join(report_dir, f"{me}.steps"), "a") as log:
            log.write(f"{generation} {step} {os.environ['JAX_COORDINATOR_ADDRESS']}\n")
    if me == 0 and checkpoint:
        with open(checkpoint + ".tmp", "w") as handle:
            json.dump({"step": step, "weight": weight}, handle)
        os.replace(checkpoint + ".tmp", checkpoint)
    multihost_utils.sync_global_devices(f"step {step}")  # the checkpoint is down before anyone goes on
    if report_dir and step == start:  # this generation's first step is done, and checkpointed
        marker = os.path.join(report_dir, f"{me}.first-{generation}")
        with open(marker + ".tmp", "w") as handle:
            handle.write(f"{step}\n")
        os.replace(marker + ".tmp", marker)
    progress(step)
    time.sleep(step_time)
# Every step added 1: a resumed job that lost or repeated a step says so.
if me == 0:
    print(f"done: {steps} steps, weight {weight:g}", flush=True)
    assert round(weight, 6) == steps, f"weight {weight} after {steps} steps"
