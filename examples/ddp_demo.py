"""A small DDP training on synthetic data: linear regression, gloo on CPU (NCCL on GPUs).

Run it the way a TrainJob would: ``trainer-launcher local --nnodes 2 --nproc-per-node 2 -- examples/ddp_demo.py``.
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device(f"cuda:{local_rank}") if backend == "nccl" else torch.device("cpu")

    torch.manual_seed(0)  # the same true weights everywhere
    true_w = torch.randn(16, 1)
    generator = torch.Generator().manual_seed(1000 + rank)  # each rank its own data shard
    model = DistributedDataParallel(torch.nn.Linear(16, 1).to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(1, args.steps + 1):
        x = torch.randn(args.batch, 16, generator=generator)
        y = x @ true_w + 0.01 * torch.randn(args.batch, 1, generator=generator)
        loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 20 == 0 or step == 1:
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            if rank == 0:
                print(f"step {step:3d}  loss {mean.item() / world:.4f}  (world size {world})", flush=True)
    dist.barrier()  # nobody tears the group down while a peer still talks to it
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # The process ends here, its output flushed, without the interpreter's shutdown. DDP keeps the
    # gloo process group's worker threads running past destroy_process_group(), and a worker still
    # retiring the last collective as the interpreter shuts down takes the GIL there and aborts the
    # whole process (SIGABRT, after the training is done: seen under load here; torch issue 117762).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
