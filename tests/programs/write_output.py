"""A rank that writes its part of the job's output, as training writes a checkpoint: OUT_DIR
(default EXPORT_PATH)/rank-<RANK>.txt, complete or absent (a temporary file, then a rename)."""

import os

directory = os.environ.get("OUT_DIR") or os.environ["EXPORT_PATH"]
os.makedirs(directory, exist_ok=True)
path = os.path.join(directory, f"rank-{os.environ['RANK']}.txt")
with open(f"{path}.tmp", "w") as handle:
    handle.write(f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']}\n")
os.replace(f"{path}.tmp", path)
