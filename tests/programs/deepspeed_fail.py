"""A DeepSpeed job whose rank FAIL_RANK exits with EXIT_CODE after one training step, while the
other ranks wait for it in a barrier that only an abort ends. The failing rank leaves through
os._exit: a gloo process that exits normally still holding its group may abort in its threads'
destructors (SIGABRT instead of its code)."""

import gc
import os

gc.disable()  # the collector paused over the imports (README.md: CI time)
import deepspeed
import deepspeed.comm as dist
import torch

gc.freeze()
gc.enable()

deepspeed.init_distributed()
rank = dist.get_rank()
model = torch.nn.Linear(4, 1)
config = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 100000,
          "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "torch_adam": True}}}
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
loss = engine(torch.randn(2, 4)).pow(2).mean()
engine.backward(loss)
engine.step()
print(f"rank {rank} stepped", flush=True)
if rank == int(os.environ["FAIL_RANK"]):
    os._exit(int(os.environ["EXIT_CODE"]))
dist.barrier()
