"""What this host can run: visible GPUs and the CPU quota, read from files, never from torch.

Every function takes its roots (``/dev``, ``/proc``, ``/sys/fs/cgroup``) as arguments so tests can
point them at a fake tree; :func:`probe_host` reads the real ones.
"""

from __future__ import annotations

import math
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path

_NVIDIA_DEVICE = re.compile(r"^nvidia\d+$")


@dataclass(frozen=True)
class HostFacts:
    hostname: str
    gpu_count: int
    cpu_quota: float | None  # cgroup limit in CPUs; None when unlimited
    cpu_affinity: int  # CPUs this process may run on
    omp_num_threads_set: bool

    @property
    def cpus(self) -> float:
        """CPUs this container can really use: the cgroup quota, capped by the affinity mask."""
        if self.cpu_quota is None:
            return float(self.cpu_affinity)
        return min(self.cpu_quota, float(self.cpu_affinity))

    @property
    def whole_cpus(self) -> int:
        # A 1.5-CPU limit runs one busy process well, not two.
        return max(1, math.floor(self.cpus + 1e-9))


def gpu_devices(dev_root: str | Path = "/dev") -> int:
    """GPUs the container can open: the /dev/nvidiaN nodes the runtime mounted."""
    try:
        return sum(1 for name in os.listdir(dev_root) if _NVIDIA_DEVICE.match(name))
    except OSError:
        return 0


def _visible_list(value: str) -> int:
    """How many devices a CUDA_VISIBLE_DEVICES-style list names (CUDA stops at the first bad one)."""
    count = 0
    for item in value.split(","):
        item = item.strip()
        if not item or item == "-1" or not (item.isdigit() or item.startswith(("GPU-", "MIG-"))):
            break
        count += 1
    return count


def visible_gpu_count(
    cuda_visible_devices: str | None,
    nvidia_visible_devices: str | None,
    dev_root: str | Path = "/dev",
) -> int:
    """GPUs a rank could use. Device nodes are the ground truth (CUDA base images set
    ``NVIDIA_VISIBLE_DEVICES=all`` on CPU nodes too); the variables can only narrow them."""
    count = gpu_devices(dev_root)
    if count == 0:
        return 0
    if nvidia_visible_devices is not None:
        value = nvidia_visible_devices.strip().lower()
        if value in ("", "none", "void"):
            return 0
        if value != "all":
            count = min(count, _visible_list(value))
    if cuda_visible_devices is not None:
        count = min(count, _visible_list(cuda_visible_devices))
    return count


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def cgroup_cpu_quota(
    proc_self_cgroup: str | Path = "/proc/self/cgroup",
    cgroup_root: str | Path = "/sys/fs/cgroup",
) -> float | None:
    """The tightest CPU limit (quota / period) on this process's cgroup and its ancestors,
    cgroup v2 (``cpu.max``) or v1 (``cpu.cfs_quota_us``); None when nothing limits it."""
    root = Path(cgroup_root)
    membership = _read(Path(proc_self_cgroup)) or ""
    limits: list[float] = []
    for line in membership.splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "" and (root / "cgroup.controllers").exists():  # v2
            limits += _walk(root, path, _v2_limit)
        elif "cpu" in controllers.split(","):  # v1
            mount = next((root / d for d in ("cpu,cpuacct", "cpu", "cpuacct,cpu") if (root / d).is_dir()), None)
            if mount is not None:
                limits += _walk(mount, path, _v1_limit)
    return min(limits) if limits else None


def _walk(mount: Path, path: str, read_limit) -> list[float]:
    """Limits from the cgroup directory up to the mount root. In a container with a cgroup
    namespace the path is "/", and the mount root itself is the container's cgroup."""
    found = []
    relative = Path(path.lstrip("/"))
    for part in [relative, *relative.parents]:
        directory = mount / part
        if directory.is_dir():
            limit = read_limit(directory)
            if limit is not None:
                found.append(limit)
    return found


def _v2_limit(directory: Path) -> float | None:
    text = _read(directory / "cpu.max")
    if not text:
        return None
    quota, _, period = text.partition(" ")
    if quota == "max" or not quota.isdigit() or not period.isdigit() or int(period) == 0:
        return None
    return int(quota) / int(period)


def _v1_limit(directory: Path) -> float | None:
    quota, period = _read(directory / "cpu.cfs_quota_us"), _read(directory / "cpu.cfs_period_us")
    if not quota or not period or not period.isdigit() or int(period) == 0:
        return None
    try:
        value = int(quota)
    except ValueError:
        return None
    return value / int(period) if value > 0 else None


def cpu_affinity() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def probe_host(host_env) -> HostFacts:
    """Read the real host. ``host_env`` is :class:`launcher.settings.HostEnv`."""
    return HostFacts(
        hostname=host_env.hostname or socket.gethostname(),  # Kubernetes sets HOSTNAME to the pod name
        gpu_count=visible_gpu_count(host_env.cuda_visible_devices, host_env.nvidia_visible_devices),
        cpu_quota=cgroup_cpu_quota(),
        cpu_affinity=cpu_affinity(),
        omp_num_threads_set=bool(host_env.omp_num_threads),
    )
