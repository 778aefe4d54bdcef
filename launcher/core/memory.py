"""The container's memory cgroup, as the kernel counts it: how many processes its OOM killer took,
and the limit it enforces. Read, not guessed: a rank killed by SIGKILL is an OOM kill only when the
kernel's own count says so.

cgroup v2: ``memory.events`` (``oom_kill N``) and ``memory.max``; cgroup v1: ``memory.oom_control``
(``oom_kill N``, Linux 4.13 and later) and ``memory.limit_in_bytes``. The cgroup is this process's
own, from ``/proc/self/cgroup``; inside a container whose cgroup is mounted as the hierarchy's root
(a cgroup namespace, or a bind mount of its own directory), the mount point itself.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

CGROUP_ROOT = "/sys/fs/cgroup"
# A v1 limit at or above this is the kernel's "unlimited" (PAGE_COUNTER_MAX pages, rounded).
_V1_UNLIMITED = 1 << 62


@dataclass(frozen=True)
class Memory:
    """One reading of the container's memory cgroup."""

    oom_kills: int | None  # None: the kernel does not count them here (or no memory cgroup)
    limit: int | None  # bytes; None: no limit

    def kills_since(self, before: Memory | None) -> int:
        """OOM kills between ``before`` and this reading (0 when either could not count)."""
        if self.oom_kills is None or before is None or before.oom_kills is None:
            return 0
        return max(0, self.oom_kills - before.oom_kills)


def parse_counters(text: str) -> dict[str, int]:
    """``key value`` lines (memory.events, memory.oom_control) as a dict; other lines skipped."""
    counters = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            counters[key] = int(value)
    return counters


def parse_limit(text: str) -> int | None:
    """memory.max ("max" or bytes) or memory.limit_in_bytes (bytes, huge when unlimited)."""
    value = text.strip()
    if not value.isdigit():
        return None
    limit = int(value)
    return None if limit >= _V1_UNLIMITED else limit


def own_cgroups(proc_cgroup: str) -> tuple[str | None, str | None]:
    """This process's (v2 path, v1 memory path) from /proc/self/cgroup's text."""
    v2 = v1 = None
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        number, controllers, path = parts
        if number == "0" and controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    return v2, v1


def _directory(mount: str, path: str | None) -> str | None:
    """The cgroup's directory under ``mount``: the path below it, else the mount itself (a
    container sees its own cgroup as the root)."""
    if path is None or not os.path.isdir(mount):
        return None
    below = os.path.join(mount, path.lstrip("/"))
    return below if os.path.isdir(below) else mount


def _read(path: str) -> str | None:
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return None


def read(root: str = CGROUP_ROOT, proc_cgroup: str = "/proc/self/cgroup") -> Memory:
    """The container's memory cgroup now. Never raises: without one, nothing is counted."""
    v2, v1 = own_cgroups(_read(proc_cgroup) or "")
    for directory, events, key, limit in (
        (_directory(os.path.join(root, "memory"), v1), "memory.oom_control", "oom_kill", "memory.limit_in_bytes"),
        (_directory(root, v2), "memory.events", "oom_kill", "memory.max"),
    ):
        if directory is None:
            continue
        counters = _read(os.path.join(directory, events))
        if counters is None:
            continue
        limit_text = _read(os.path.join(directory, limit))
        return Memory(parse_counters(counters).get(key), parse_limit(limit_text) if limit_text else None)
    return Memory(None, None)


def describe_limit(limit: int | None) -> str:
    """'the container's memory limit is 2 GiB', or that it has none the kernel enforces here."""
    if limit is None:
        return "the container has no memory limit of its own (the node ran out of memory)"
    gib = limit / 2**30
    shown = f"{gib:.3g} GiB" if gib >= 1 else f"{limit / 2**20:.0f} MiB"
    return f"the container's memory limit is {shown}"
