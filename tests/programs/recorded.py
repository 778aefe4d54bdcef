"""Rank 1 raises inside torch's own @record: torchrun's error file then holds its words."""

import gc
import os

gc.disable()  # the collector paused over the imports (README.md: CI time)
from torch.distributed.elastic.multiprocessing.errors import record

gc.freeze()
gc.enable()


@record
def main() -> None:
    if os.environ["RANK"] == "1":
        raise ValueError("loss is nan at step 7")


main()
