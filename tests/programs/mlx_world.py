"""One line per rank: its place in MLX's distributed world and an all_sum of rank + 1."""

import json
import socket

import mlx.core as mx

group = mx.distributed.init()  # not strict: a missing MPI must show as a world of one
total = mx.distributed.all_sum(mx.array(group.rank() + 1))
print("MLX " + json.dumps({"rank": group.rank(), "size": group.size(), "sum": total.item(),
                           "host": socket.gethostname()}), flush=True)
