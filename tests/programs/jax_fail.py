"""A JAX process that meets the others in a collective, then (process FAIL_ID only) fails the way
FAIL_HOW says, while the others block in the next collective: ``exit`` (sys.exit(FAIL_CODE)),
``raise`` (an exception), ``kill`` (SIGKILL itself, no word to anyone) or ``signal:<NAME>`` (that
signal to itself: SIGSEGV for a native crash), ``fault`` (it prints an NCCL system error, as a
process on a broken node does, and exits 1); ``train`` (no process fails: every one meets the
others in TRAIN_STEPS more collectives, for a test that ends the job from outside). With
REPORT_DIR set, each writes <process id>.step there (atomically) after its first collective."""

import gc
import os
import signal
import sys
import time

gc.disable()  # the collector paused over the imports (README.md: CI time)
import jax
import jax.numpy as jnp
from jax.experimental import multihost_utils

gc.freeze()
gc.enable()

jax.distributed.initialize()
multihost_utils.process_allgather(jnp.array(jax.process_index()))
if os.environ.get("REPORT_DIR"):
    marker = os.path.join(os.environ["REPORT_DIR"], f"{jax.process_index()}.step")
    with open(marker + ".tmp", "w") as handle:
        handle.write(str(os.getpid()))
    os.replace(marker + ".tmp", marker)
if os.environ.get("FAIL_HOW") == "train":
    for _ in range(int(os.environ.get("TRAIN_STEPS", "100000"))):
        multihost_utils.process_allgather(jnp.array(jax.process_index()))
        time.sleep(0.01)
    sys.exit(0)
if jax.process_index() == int(os.environ.get("FAIL_ID", "1")):
    how = os.environ.get("FAIL_HOW", "exit")
    print(f"process {jax.process_index()} fails ({how})", flush=True)
    if how == "raise":
        raise ValueError("the loss is NaN")
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how.startswith("signal:"):
        os.kill(os.getpid(), signal.Signals[how.split(":")[1]])
    if how == "fault":  # what a process on a broken node prints before it exits 1
        print("NCCL error in: ProcessGroupNCCL.cpp:2050, unhandled system error", file=sys.stderr, flush=True)
        sys.exit(1)
    sys.exit(int(os.environ.get("FAIL_CODE", "3")))
multihost_utils.process_allgather(jnp.array(jax.process_index()))
print("unreachable: a peer failed before this collective", flush=True)
