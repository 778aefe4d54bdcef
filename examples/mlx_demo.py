"""Data-parallel linear regression with MLX: each rank fits its own shard of synthetic data and
the gradients are averaged over every rank with ``all_sum`` (MLX's MPI backend).

MLX's MPI backend supports Open MPI only. It loads libmpi itself: ``trainer-launcher mpi``
tells it where (``MLX_MPI_LIBNAME``). ``strict=True`` fails loudly where MPI cannot be used,
instead of letting every rank train alone as a world of one.

Run it the way a TrainJob on ``mlx-distributed`` would:
``trainer-launcher local --mpi openmpi --nnodes 2 -- python examples/mlx_demo.py``.
On a cluster: ``examples/trainjob-mlx.yaml``.
"""

import argparse
import hashlib
import json
import socket

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.nn.utils import average_gradients


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()

    group = mx.distributed.init(strict=True)
    rank, world = group.rank(), group.size()
    total = mx.distributed.all_sum(mx.array(rank + 1))  # 1 + 2 + ... + world, if every rank takes part

    mx.random.seed(0)  # the same true weights and initial model everywhere
    true_w = mx.random.normal((16, 1))
    model = nn.Linear(16, 1, bias=False)
    optimizer = optim.SGD(learning_rate=args.lr)
    key = mx.random.key(1000 + rank)  # each rank its own shard
    x = mx.random.normal((64, 16), key=key)
    y = x @ true_w

    def loss_fn(model, x, y):
        return nn.losses.mse_loss(model(x), y)

    loss_and_grad = nn.value_and_grad(model, loss_fn)
    for step in range(1, args.steps + 1):
        loss, grads = loss_and_grad(model, x, y)
        optimizer.update(model, average_gradients(grads))
        mx.eval(model.parameters(), optimizer.state, loss)
        if rank == 0 and (step == 1 or step % 20 == 0):
            print(f"step {step:3d}  loss {loss.item():.6f}  (world size {world})", flush=True)

    weights = np.array(model.weight)
    summary = {
        "rank": rank, "world": world, "host": socket.gethostname(), "steps": args.steps,
        "allSum": total.item(), "loss": round(loss.item(), 8),
        "error": round(float(np.abs(weights.T - np.array(true_w)).max()), 6),
        # Data parallel: every rank must end with the very same weights.
        "weights": hashlib.sha256(weights.tobytes()).hexdigest()[:16],
    }
    print("summary " + json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
