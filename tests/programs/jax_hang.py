"""JAX processes in step, until one stops joining the collective the others wait in: HANG_AT.
Every process prints its progress, so each pod's launcher sees its own process stop."""

import gc
import os
import time

gc.disable()  # the collector paused over the imports (README.md: CI time)
import jax
import jax.numpy as jnp
from jax.experimental import multihost_utils

gc.freeze()
gc.enable()


def stuck_forever() -> None:
    while True:
        time.sleep(3600)


me = jax.process_index()
for step in range(1, 1000):
    if me == 1 and step == int(os.environ["HANG_AT"]):
        stuck_forever()
    total = multihost_utils.process_allgather(jnp.ones(1) * step)
    time.sleep(0.2)
    print(f"step={step} loss={1.0 / step:.4f} gathered={float(total.sum()):.1f}", flush=True)
