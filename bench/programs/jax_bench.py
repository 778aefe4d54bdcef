"""A JAX process for bench/bench_jax.py, written the way upstream's docs write it: initialize
with the three JAX_* values by hand (through trainer-launcher that call does nothing).

    ok    one cross-process allgather, then exit 0
    fail  one allgather; process FAIL_ID records time.time() in FAIL_STAMP and exits 3 while the
          others block in a second allgather
"""

import os
import sys
import time

import jax

jax.distributed.initialize(coordinator_address=os.environ["JAX_COORDINATOR_ADDRESS"],
                           num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
                           process_id=int(os.environ["JAX_PROCESS_ID"]))

import jax.numpy as jnp  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

total = multihost_utils.process_allgather(jnp.array(jax.process_index() + 1)).sum()
assert int(total) == jax.process_count() * (jax.process_count() + 1) // 2, total
if sys.argv[1:] == ["fail"]:
    if jax.process_index() == int(os.environ.get("FAIL_ID", "1")):
        stamp = os.environ["FAIL_STAMP"]
        with open(stamp + ".tmp", "w") as handle:
            handle.write(repr(time.time()))
        os.replace(stamp + ".tmp", stamp)
        sys.exit(3)
    multihost_utils.process_allgather(jnp.array(jax.process_index()))
