"""Rank 1 raises inside torch's own @record: torchrun's error file then holds its words."""

import os

from torch.distributed.elastic.multiprocessing.errors import record


@record
def main() -> None:
    if os.environ["RANK"] == "1":
        raise ValueError("loss is nan at step 7")


main()
