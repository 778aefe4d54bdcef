"""Accelerate's own pattern for distributed inference: ``PartialState()`` alone, no ``Accelerator()``.
Each process splits the prompts between the processes, gathers every process's index through the
state (a real collective over the world PartialState formed), and writes REPORT_DIR/<RANK>.json
(torchrun's rank: under a world of one every process would be index 0) with what it saw.
"""

import gc
import json
import os

gc.disable()  # the collector paused over the imports (README.md: CI time)
from accelerate import PartialState
from accelerate.utils import gather_object

gc.freeze()
gc.enable()

state = PartialState()
with state.split_between_processes(["a cat", "a dog"]) as prompts:
    mine = list(prompts)
report = {
    "type": str(state.distributed_type), "processes": state.num_processes, "index": state.process_index,
    "worldSize": os.environ.get("WORLD_SIZE"), "prompts": mine, "gathered": gather_object([state.process_index]),
}
directory, rank = os.environ["REPORT_DIR"], os.environ["RANK"]
with open(os.path.join(directory, f".{rank}.tmp"), "w") as handle:
    json.dump(report, handle)
os.replace(os.path.join(directory, f".{rank}.tmp"), os.path.join(directory, f"{rank}.json"))
state.wait_for_everyone()
state.destroy_process_group()
