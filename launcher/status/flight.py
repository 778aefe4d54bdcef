"""PyTorch's flight recorder: where a framework's plan asks the ranks to write it, and what they wrote.

With ``TORCH_NCCL_DUMP_ON_TIMEOUT=1`` every NCCL rank writes its ring of recent collectives to
``<prefix><rank>`` when its watchdog sees a collective time out, which names the collective each
rank was stuck in. The plan points the prefix into a directory of its own under :data:`ROOT`;
a hang's termination message lists what is there.
"""

from __future__ import annotations

import os

ROOT = "/tmp/trainer-launcher-fr"
FILE_PREFIX = "rank_"
# The newest first, this many at most: enough to see which ranks dumped, small enough to report.
MAX_LISTED = 64


def directory(job: str | None) -> str:
    """The dumps' directory for a job (a TrainJob's name when known)."""
    return os.path.join(ROOT, job or "job")


def dumps(root: str = ROOT, since: float | None = None) -> list[str]:
    """The dump files under ``root`` (newest first), those written after ``since`` (wall-clock
    seconds) when given. A missing directory means none."""
    found = []
    for here, _, files in os.walk(root):
        for name in files:
            path = os.path.join(here, name)
            try:
                written = os.stat(path).st_mtime
            except OSError:
                continue
            if since is None or written >= since:
                found.append((written, path))
    return [path for _, path in sorted(found, reverse=True)[:MAX_LISTED]]
