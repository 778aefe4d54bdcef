"""Data-parallel linear regression with JAX: each process fits its own shard, gradients are
averaged over every device of every process (a cross-process collective; gloo on CPU).

Run it the way a TrainJob would: ``trainer-launcher local --framework jax --nnodes 2 -- python examples/jax_demo.py``.
On a cluster: ``examples/trainjob-jax.yaml``.
"""

import argparse
import functools

import jax
import jax.numpy as jnp


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()

    # Under trainer-launcher this does nothing: the launcher initialized JAX from JAX_* already.
    # Without it, pass coordinator_address, num_processes and process_id yourself.
    jax.distributed.initialize()
    local = jax.local_device_count()

    true_w = jax.random.normal(jax.random.PRNGKey(0), (16,))  # the same everywhere
    x = jax.random.normal(jax.random.PRNGKey(1000 + jax.process_index()), (local, 64, 16))  # this process's shard
    y = x @ true_w
    w = jnp.zeros((local, 16))

    @functools.partial(jax.pmap, axis_name="devices")
    def step(w, x, y):
        loss, grad = jax.value_and_grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)
        return w - args.lr * jax.lax.pmean(grad, "devices"), jax.lax.pmean(loss, "devices")

    for i in range(args.steps):
        w, loss = step(w, x, y)
        if jax.process_index() == 0 and (i % 20 == 0 or i == args.steps - 1):
            print(f"step {i}: loss {float(loss[0]):.6f}", flush=True)
    error = float(jnp.max(jnp.abs(w[0] - true_w)))
    print(f"process {jax.process_index()} of {jax.process_count()}, {jax.device_count()} devices: "
          f"max weight error {error:.2e}", flush=True)


if __name__ == "__main__":
    main()
