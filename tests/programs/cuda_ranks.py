"""A rank on a GPU: NCCL all-reduce over every rank's device, then the end CUDA_FAIL asks for.

CUDA_FAIL  "" (default): print "rank R on <device name>: all_reduce N" and succeed;
           "assert": index out of range on the device (a device-side assert: the program's bug);
           "oom": ask the device for far more memory than it has (CUDA out of memory)
"""

import os

import torch
import torch.distributed as dist

local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
dist.init_process_group("nccl")
rank = dist.get_rank()
value = torch.tensor([float(rank + 1)], device="cuda")
dist.all_reduce(value)
fail = os.environ.get("CUDA_FAIL", "")
if fail == "assert":
    values = torch.arange(3, device="cuda")
    print(values[torch.tensor([5], device="cuda")].item(), flush=True)
elif fail == "oom":
    torch.empty(1 << 50, dtype=torch.uint8, device="cuda")
print(f"rank {rank} on {torch.cuda.get_device_name()}: all_reduce {value.item():g}", flush=True)
dist.destroy_process_group()
