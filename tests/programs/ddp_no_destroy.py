"""A data-parallel training script of the shape users copy from pytorch/examples' DDP tutorial
series (multinode): a Trainer around a DistributedDataParallel model, a DataLoader over a
DistributedSampler, a few epochs, a snapshot saved by global rank 0, ``init_process_group`` at
the start and no ``destroy_process_group`` at the end (unless DESTROY=1): the process group is
still up when the interpreter exits.

EPOCHS       how many epochs (default 3)
REPORT_DIR   each rank writes <rank>.end after its last epoch, and <rank>.atexit from an exit
             handler of its own
SNAPSHOT     where global rank 0 saves its snapshot (default: REPORT_DIR/snapshot.pt)
DESTROY      1: destroy_process_group() at the end of main(), the Trainer still alive (as
             pytorch/examples' own script does; DistributedDataParallel keeps gloo's threads)
END          how global rank 1 ends after its last epoch: "" (returns), "exit-3" (sys.exit(3)),
             "raise" (an uncaught exception) or "abort" (os.abort(), before its .end)
"""

import atexit
import gc
import os
import sys

gc.disable()  # the collector paused over the imports (README.md: CI time)
import torch
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

gc.freeze()
gc.enable()


class Pairs(Dataset):
    """Random inputs and targets, made once."""

    def __init__(self, count):
        generator = torch.Generator().manual_seed(0)
        self.inputs = torch.rand(count, 20, generator=generator)
        self.targets = torch.rand(count, 1, generator=generator)

    def __len__(self):
        return len(self.inputs)

    def __getitem__(self, index):
        return self.inputs[index], self.targets[index]


class Trainer:
    def __init__(self, model, loader, optimizer, snapshot_path):
        self.rank = int(os.environ["RANK"])
        self.model = DistributedDataParallel(model)
        self.loader = loader
        self.optimizer = optimizer
        self.snapshot_path = snapshot_path

    def _step(self, inputs, targets):
        self.optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(self.model(inputs), targets)
        loss.backward()
        self.optimizer.step()

    def _epoch(self, epoch):
        self.loader.sampler.set_epoch(epoch)
        for inputs, targets in self.loader:
            self._step(inputs, targets)

    def _snapshot(self, epoch):
        torch.save({"model": self.model.module.state_dict(), "epochs": epoch + 1}, self.snapshot_path)

    def train(self, epochs):
        for epoch in range(epochs):
            self._epoch(epoch)
            if self.rank == 0:
                self._snapshot(epoch)
            print(f"rank {self.rank}: epoch {epoch} done", flush=True)


def _write(path):
    """Atomically: a temporary file, then a rename."""
    with open(path + ".tmp", "w") as handle:
        handle.write("done\n")
    os.replace(path + ".tmp", path)


def main():
    init_process_group(backend="gloo")
    report_dir = os.environ["REPORT_DIR"]
    rank = os.environ["RANK"]
    atexit.register(_write, os.path.join(report_dir, f"{rank}.atexit"))
    data = Pairs(512)
    loader = DataLoader(data, batch_size=32, shuffle=False, sampler=DistributedSampler(data))
    model = torch.nn.Linear(20, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    snapshot = os.environ.get("SNAPSHOT") or os.path.join(report_dir, "snapshot.pt")
    trainer = Trainer(model, loader, optimizer, snapshot)
    trainer.train(int(os.environ.get("EPOCHS", "3")))
    end = os.environ.get("END", "") if rank == "1" else ""
    if end == "abort":
        os.abort()
    _write(os.path.join(report_dir, f"{rank}.end"))
    if end == "exit-3":
        sys.exit(3)
    if end == "raise":
        raise RuntimeError("rank 1 failed after its last epoch")
    if os.environ.get("DESTROY") == "1":
        destroy_process_group()


if __name__ == "__main__":
    main()
