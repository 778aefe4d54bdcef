"""An MLX job whose rank FAIL_RANK fails (BEHAVIOUR exit:N or raise:MESSAGE) after one all_sum,
while the other ranks wait for it in a second all_sum that only an abort ends."""

import os
import sys

import mlx.core as mx

group = mx.distributed.init(strict=True)
mx.eval(mx.distributed.all_sum(mx.array(1.0)))
print(f"rank {group.rank()} of {group.size()} summed", flush=True)
if group.rank() == int(os.environ["FAIL_RANK"]):
    kind, _, value = os.environ["BEHAVIOUR"].partition(":")
    if kind == "exit":
        sys.exit(int(value))
    raise RuntimeError(value)
mx.eval(mx.distributed.all_sum(mx.array(1.0)))
