"""A JAX process that meets the others in a collective, then (process FAIL_ID only) fails the way
FAIL_HOW says, while the others block in the next collective: ``exit`` (sys.exit(FAIL_CODE)),
``raise`` (an exception), ``kill`` (SIGKILL itself, no word to anyone) or ``signal:<NAME>`` (that
signal to itself: SIGSEGV for a native crash)."""

import gc
import os
import signal
import sys

gc.disable()  # the collector paused over the imports (README.md: CI time)
import jax
import jax.numpy as jnp
from jax.experimental import multihost_utils

gc.freeze()
gc.enable()

jax.distributed.initialize()
multihost_utils.process_allgather(jnp.array(jax.process_index()))
if jax.process_index() == int(os.environ.get("FAIL_ID", "1")):
    how = os.environ.get("FAIL_HOW", "exit")
    print(f"process {jax.process_index()} fails ({how})", flush=True)
    if how == "raise":
        raise ValueError("the loss is NaN")
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how.startswith("signal:"):
        os.kill(os.getpid(), signal.Signals[how.split(":")[1]])
    sys.exit(int(os.environ.get("FAIL_CODE", "3")))
multihost_utils.process_allgather(jnp.array(jax.process_index()))
print("unreachable: a peer failed before this collective", flush=True)
