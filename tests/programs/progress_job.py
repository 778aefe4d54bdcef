"""A training-loop stand-in for the status and hang tests: real gloo all-reduces, real prints.

Rank 0 prints its progress the way users' programs do (STYLE=hf: HuggingFace Trainer's log dicts
and a tqdm-like N/M bar; STYLE=katib: `name=value` lines). Environment knobs:
  STEPS, DELAY        how many steps, and the seconds each one takes (default 20, 0.5)
  FAIL_RANK, FAIL_AT  that rank exits 3 at that step
  HANG_RANK, HANG_AT  that rank stops calling the collective at that step (the others wait in it)
  API=1               every rank also calls launcher.progress.report(step=, total=)
  ENV_OUT             write this process's environment (JSON) to ENV_OUT/<rank>.json
  LAST_STEP           rank 0 writes the wall-clock time of its last completed step there
  UNTIL               the job ends after the step during which this file appeared (before STEPS)
"""

import gc
import json
import os
import sys
import time

gc.disable()  # the collector paused over the imports (README.md: CI time)
import torch
import torch.distributed as dist

gc.freeze()
gc.enable()


def stuck_forever() -> None:
    while True:
        time.sleep(3600)


def main() -> int:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    steps, delay = int(os.environ.get("STEPS", "20")), float(os.environ.get("DELAY", "0.5"))
    style = os.environ.get("STYLE", "hf")
    if os.environ.get("ENV_OUT"):
        path = os.path.join(os.environ["ENV_OUT"], f"{rank}.json")
        with open(path + ".tmp", "w") as handle:
            json.dump(dict(os.environ), handle)
        os.replace(path + ".tmp", path)
    if os.environ.get("API"):
        from launcher import progress
    for step in range(1, steps + 1):
        if str(rank) == os.environ.get("FAIL_RANK") and step == int(os.environ["FAIL_AT"]):
            print(f"rank {rank} fails at step {step}", flush=True)
            return 3
        if str(rank) == os.environ.get("HANG_RANK") and step == int(os.environ["HANG_AT"]):
            stuck_forever()
        total = torch.ones(1) * (rank + 1)
        dist.all_reduce(total)
        time.sleep(delay)
        loss = 2.0 / step
        if os.environ.get("API"):
            progress.report(step=step, total=steps, loss=loss)
        if rank == 0:
            if style == "hf":
                print({"loss": round(loss, 4), "grad_norm": 0.5, "learning_rate": 5e-05, "epoch": round(step / steps, 2)},
                      flush=True)
                print(f"{100 * step // steps}%|####      | {step}/{steps} [00:0{step}<00:10,  2.00it/s]", file=sys.stderr,
                      flush=True)
            else:
                print(f"step={step} loss={loss:.4f} accuracy={step / steps:.3f}", flush=True)
            if os.environ.get("LAST_STEP"):
                with open(os.environ["LAST_STEP"] + ".tmp", "w") as handle:
                    handle.write(str(time.time()))
                os.replace(os.environ["LAST_STEP"] + ".tmp", os.environ["LAST_STEP"])
        if os.environ.get("UNTIL"):  # every rank ends at the same step: the largest of their views
            seen = torch.tensor([float(os.path.exists(os.environ["UNTIL"]))])
            dist.all_reduce(seen, op=dist.ReduceOp.MAX)
            if seen.item():
                break
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
