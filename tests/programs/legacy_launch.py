"""A script written for ``python -m torch.distributed.launch``: it reads ``--local-rank`` (or, with
``--use-env``, LOCAL_RANK), joins the gloo group, and writes REPORT_DIR/<rank>.json with its
arguments, its local rank by both ways, and the all-reduce it saw."""

import argparse
import gc
import json
import os

gc.disable()  # the collector paused over the imports (README.md: CI time)
import torch
import torch.distributed as dist

gc.freeze()
gc.enable()

parser = argparse.ArgumentParser()
parser.add_argument("--local-rank", "--local_rank", type=int, default=None)
parser.add_argument("--tag", default="")
args, _ = parser.parse_known_args()
dist.init_process_group("gloo")
rank = dist.get_rank()
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
report = {"rank": rank, "world": dist.get_world_size(), "argLocalRank": args.local_rank,
          "envLocalRank": os.environ.get("LOCAL_RANK"), "tag": args.tag, "allreduce": float(total)}
directory = os.environ["REPORT_DIR"]
with open(os.path.join(directory, f".{rank}.tmp"), "w") as handle:
    json.dump(report, handle)
os.replace(os.path.join(directory, f".{rank}.tmp"), os.path.join(directory, f"{rank}.json"))
dist.destroy_process_group()
