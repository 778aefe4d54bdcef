"""A tiny Accelerate training script: a linear model and data made here, a few steps of SGD through
``Accelerator.prepare`` (DDP when the world is larger than one), then each process writes
REPORT_DIR/<process index>.json with what Accelerate saw (world, distributed type, mixed
precision) and a checksum of its parameters, which is the same on every process when the
gradients were averaged across all of them.

FAIL_RANK  the process index that exits with EXIT_CODE (default 3) after the first step, at once
           (os._exit: a gloo process that exits normally still holding its group may abort in its
           threads' destructors, "terminate called without an active exception", and end by
           SIGABRT instead of its code: caught once in the project's CI, stop 31)
"""

import gc
import json
import os
import sys

gc.disable()  # the collector paused over the imports (README.md: CI time)
import torch
from accelerate import Accelerator

gc.freeze()
gc.enable()

accelerator = Accelerator()
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
initial = float(sum(p.detach().abs().sum() for p in model.parameters()))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = accelerator.prepare(model, optimizer)
index = accelerator.process_index
# Every process gets different data: only averaged gradients keep the replicas equal.
generator = torch.Generator().manual_seed(1000 + index)
for step in range(3):
    inputs = torch.randn(16, 8, generator=generator).to(accelerator.device)
    targets = inputs.sum(dim=1, keepdim=True)
    loss = torch.nn.functional.mse_loss(model(inputs), targets)
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    if step == 0 and index == int(os.environ.get("FAIL_RANK", "-1")):
        print(f"process {index} fails on purpose", flush=True)
        os._exit(int(os.environ.get("EXIT_CODE", "3")))
checksum = float(sum(p.detach().double().sum() for p in accelerator.unwrap_model(model).parameters()))
seen = accelerator.reduce(torch.tensor([float(index + 1)], device=accelerator.device), "sum")
report = {
    "index": index, "local": accelerator.local_process_index, "world": accelerator.num_processes,
    "type": str(accelerator.distributed_type), "mixedPrecision": accelerator.mixed_precision,
    "checksum": round(checksum, 6), "initial": round(initial, 6), "reduced": float(seen),
    "env": {name: os.environ.get(name) for name in ("ACCELERATE_MIXED_PRECISION", "ACCELERATE_USE_CPU",
                                                     "MASTER_PORT", "OMP_NUM_THREADS")},
}
directory = os.environ["REPORT_DIR"]
with open(os.path.join(directory, f".{index}.tmp"), "w") as handle:
    json.dump(report, handle)
os.replace(os.path.join(directory, f".{index}.tmp"), os.path.join(directory, f"{index}.json"))
accelerator.wait_for_everyone()
accelerator.end_training()
# The program ends without Python's finalization. The DDP model keeps the gloo process group alive
# past destroy_process_group (torch 2.13: its worker threads are not joined), and a worker thread
# may still be retiring the last barrier when the interpreter finalizes: dropping the last
# reference to a Python-owned tensor there needs the GIL, the thread is made to exit inside a C++
# destructor, and the process aborts ("terminate called without an active exception", SIGABRT,
# after its report was written). A core dump, reproduced with this test's two pods, showed that stack
# (~AsyncBarrierWork -> decref_pyobject -> take_gil -> pthread_exit; torch issue 117762) in 1 run of ~12 under
# CPU burners. destroy_process_group() is still called, as torch asks.
if torch.distributed.is_initialized():
    torch.distributed.destroy_process_group()
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
