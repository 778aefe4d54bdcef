"""A JAX process of a multi-process job: bare ``jax.distributed.initialize()`` (as trainer-launcher
lets a program write it), then two cross-process collectives over every process; prints what they
summed. ``--explicit`` calls initialize the upstream way instead, with the three JAX_* values."""

import gc
import os
import sys

gc.disable()  # the collector paused over the imports (README.md: CI time)
import jax

if "--explicit" in sys.argv:
    jax.distributed.initialize(coordinator_address=os.environ["JAX_COORDINATOR_ADDRESS"],
                               num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
                               process_id=int(os.environ["JAX_PROCESS_ID"]))
else:
    jax.distributed.initialize()

import jax.numpy as jnp  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

gc.freeze()
gc.enable()

ids = multihost_utils.process_allgather(jnp.array(jax.process_index() + 1))
ones = jax.pmap(lambda x: jax.lax.psum(x, "i"), axis_name="i")(jnp.ones(jax.local_device_count()))
print(f"process {jax.process_index()} of {jax.process_count()}: allgather sum {int(ids.sum())}, "
      f"psum over {jax.device_count()} devices {int(ones[0])}", flush=True)
