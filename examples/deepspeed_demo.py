"""Data-parallel linear regression with DeepSpeed (ZeRO stage 1 by default, from
``deepspeed_config.json`` beside this file): each rank fits its own shard of synthetic data.

DeepSpeed finds its ranks from MPI: under ``mpirun`` it reads the rank and world size through
mpi4py and takes rank 0's address as the master. On CPU it runs on gloo; its CPU accelerator
builds a small shared-memory op on first use, which needs a C++ compiler in the image.

Run it the way a TrainJob on ``deepspeed-distributed`` would:
``trainer-launcher local --mpi openmpi --nnodes 2 -- python examples/deepspeed_demo.py``.
On a cluster: ``examples/trainjob-deepspeed.yaml``.
"""

import argparse
import hashlib
import json
import os
import socket

import deepspeed
import deepspeed.comm as dist
import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                         "deepspeed_config.json"))
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()

    deepspeed.init_distributed()  # nccl on GPUs, gloo on CPU; ranks from the MPI environment
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)  # the same true weights and initial model everywhere
    true_w = torch.randn(16, 1)
    model = torch.nn.Linear(16, 1, bias=False)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=args.config)
    batch = engine.train_micro_batch_size_per_gpu()
    generator = torch.Generator().manual_seed(1000 + rank)  # each rank its own shard
    for step in range(1, args.steps + 1):
        x = torch.randn(batch, 16, generator=generator)
        y = x @ true_w + 0.01 * torch.randn(batch, 1, generator=generator)
        loss = torch.nn.functional.mse_loss(engine(x.to(engine.device)), y.to(engine.device))
        engine.backward(loss)
        engine.step()
        if rank == 0 and (step == 1 or step % 10 == 0):
            print(f"step {step:3d}  loss {loss.item():.4f}  (world size {world})", flush=True)

    weights = engine.module.weight.detach().float().cpu()
    summary = {
        "rank": rank, "world": world, "host": socket.gethostname(), "steps": engine.global_steps,
        "loss": round(loss.item(), 6), "error": round((weights.T - true_w).abs().max().item(), 6),
        # Data parallel: every rank must end with the very same weights.
        "weights": hashlib.sha256(weights.numpy().tobytes()).hexdigest()[:16],
    }
    print("summary " + json.dumps(summary), flush=True)
    dist.barrier()  # nobody tears the group down while a peer still talks to it


if __name__ == "__main__":
    main()
