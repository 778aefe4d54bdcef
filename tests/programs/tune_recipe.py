"""A stand-in torchtune recipe: called the way `tune run` calls a recipe (``--config PATH`` and
``key=value`` overrides), it joins the process group when torchrun started it, all-reduces, and
writes what it saw. No model and no download: the tests need the launcher's side, not training.

Config keys (the YAML, then the overrides): output_dir (required) gets <rank>.json with the rank,
world size, all-reduce, config and overrides; fail_rank and exit_code make that rank exit with
that code after the all-reduce while the others wait: in a barrier, as a real recipe's next
collective would (others_wait: barrier, the default), or asleep (others_wait: sleep).
"""

import json
import os
import sys
import time

import yaml


def read_config(argv: list[str]) -> tuple[dict, str, list[str]]:
    if "--config" not in argv:
        sys.exit("usage: tune_recipe.py --config PATH [KEY=VALUE ...]")
    at = argv.index("--config")
    path, overrides = argv[at + 1], argv[:at] + argv[at + 2:]
    with open(path) as handle:
        config = yaml.safe_load(handle) or {}
    for override in overrides:
        key, _, value = override.partition("=")
        config[key] = yaml.safe_load(value)
    return config, path, overrides


config, config_path, overrides = read_config(sys.argv[1:])
distributed = "RANK" in os.environ
rank = int(os.environ.get("RANK", "0"))
world_size = int(os.environ.get("WORLD_SIZE", "1"))
total = float(rank + 1)
if distributed:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    reduced = torch.tensor([total])
    dist.all_reduce(reduced)
    total = reduced.item()
report = {"rank": rank, "world_size": world_size, "allreduce": total, "distributed": distributed,
          "config_path": config_path, "overrides": overrides, "config": config, "argv0": sys.argv[0]}
output_dir = config["output_dir"]
with open(os.path.join(output_dir, f".{rank}.json.tmp"), "w") as handle:
    json.dump(report, handle)
os.replace(os.path.join(output_dir, f".{rank}.json.tmp"), os.path.join(output_dir, f"{rank}.json"))
print(f"recipe rank {rank} of {world_size}: all-reduce {total}", flush=True)
failing = config.get("fail_rank", -1)
if rank == failing:
    time.sleep(0.2)
    sys.exit(int(config["exit_code"]))
if failing >= 0 and config.get("others_wait") == "sleep":
    time.sleep(300)
if distributed:
    dist.barrier()
    dist.destroy_process_group()
