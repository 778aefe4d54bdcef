"""What this host can run: visible accelerators and the CPU quota, read from files, never from a framework.

Every function takes its roots (``/dev``, ``/proc``, ``/sys``) as arguments so tests can point them
at a fake tree; :func:`probe_host` reads the real ones.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path

from launcher.core.outcome import ConfigError

_NVIDIA_DEVICE = re.compile(r"^nvidia\d+$")
_NEURON_DEVICE = re.compile(r"^neuron(\d+)$")
_GAUDI_DEVICE = re.compile(r"^accel\d+$")  # the kernel's accel class: /dev/accel/accelN
_GAUDI_LEGACY_DEVICE = re.compile(r"^hl\d+$")  # habanalabs drivers before the accel class


@dataclass(frozen=True)
class Accelerators:
    """The accelerators of one kind this container can use; each takes one training process."""

    kind: str  # singular, for messages: "NVIDIA GPU", "NVIDIA MIG device", "Neuron core", "Gaudi HPU"
    count: int | None  # None: they are there, but how many processes they take is unknown
    how: str  # what the count was read from


@dataclass(frozen=True)
class HostFacts:
    hostname: str
    gpu_count: int
    cpu_quota: float | None  # cgroup limit in CPUs; None when unlimited
    cpu_affinity: int  # CPUs this process may run on
    omp_num_threads_set: bool
    # Every visible accelerator, NVIDIA included; None: none (or, in hand-made facts, only gpu_count).
    accelerators: Accelerators | None = None

    @property
    def accelerator(self) -> Accelerators | None:
        """The visible accelerators, whatever the facts were built from."""
        if self.accelerators is not None:
            return self.accelerators
        return Accelerators("NVIDIA GPU", self.gpu_count, "/dev/nvidiaN") if self.gpu_count else None

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


def _visible_items(value: str) -> list[str]:
    """The devices a CUDA_VISIBLE_DEVICES-style list names (CUDA stops at the first bad one)."""
    items = []
    for item in value.split(","):
        item = item.strip()
        if not item or item == "-1" or not (item.isdigit() or item.upper().startswith(("GPU-", "MIG-"))):
            break
        items.append(item)
    return items


def _visible_list(value: str) -> int:
    return len(_visible_items(value))


def visible_gpu_count(
    cuda_visible_devices: str | None,
    nvidia_visible_devices: str | None,
    dev_root: str | Path = "/dev",
) -> int:
    """CUDA devices a rank could use, MIG devices included. Device nodes are the ground truth
    (CUDA base images set ``NVIDIA_VISIBLE_DEVICES=all`` on CPU nodes too); the variables can only
    narrow them. A MIG device has no node of its own: the device plugin lists ``MIG-<uuid>`` in
    NVIDIA_VISIBLE_DEVICES and the container gets its parent GPU's ``/dev/nvidiaN``, shared by
    every slice of that GPU, so MIG entries count as listed."""
    count = gpu_devices(dev_root)
    if count == 0:
        return 0
    if nvidia_visible_devices is not None:
        value = nvidia_visible_devices.strip()
        if value.lower() in ("", "none", "void"):
            return 0
        if value.lower() != "all":
            items = _visible_items(value)
            slices = sum(1 for item in items if item.upper().startswith("MIG-"))
            count = min(count, len(items) - slices) + slices
    if cuda_visible_devices is not None:
        count = min(count, _visible_list(cuda_visible_devices))
    return count


def nvidia_accelerators(
    cuda_visible_devices: str | None, nvidia_visible_devices: str | None, dev_root: str | Path = "/dev"
) -> Accelerators | None:
    count = visible_gpu_count(cuda_visible_devices, nvidia_visible_devices, dev_root)
    if not count:
        return None
    mig = any(item.upper().startswith("MIG-") for item in (nvidia_visible_devices or "").split(","))
    return Accelerators(
        "NVIDIA MIG device" if mig else "NVIDIA GPU", count, "NVIDIA_VISIBLE_DEVICES" if mig else "/dev/nvidiaN"
    )


def _indices(value: str) -> list[int] | None:
    """``0,2``, ``0-3`` or ``1,4-5``: the indices named; None when it is not such a list."""
    found: list[int] = []
    for part in value.replace(" ", "").split(","):
        low, dash, high = part.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            return None
        found += range(int(low), int(high) + 1) if dash else [int(low)]
    return found


def neuron_accelerators(
    visible_cores: str | None,
    visible_devices: str | None,
    logical_nc_config: str | None = None,
    dev_root: str | Path = "/dev",
    sys_root: str | Path = "/sys",
) -> Accelerators | None:
    """AWS Neuron cores (Trainium, Inferentia): one training process drives one core.

    ``NEURON_RT_VISIBLE_CORES`` (``0-3``) names them when set. Otherwise each visible
    ``/dev/neuronN`` device (narrowed by ``AWS_NEURON_VISIBLE_DEVICES``) contributes the
    ``core_count`` the driver publishes in sysfs, divided by ``NEURON_LOGICAL_NC_CONFIG`` when that
    fuses cores; a device whose count cannot be read makes the total unknown (None)."""
    try:
        devices = sorted(int(m[1]) for name in os.listdir(dev_root) if (m := _NEURON_DEVICE.match(name)))
    except OSError:
        devices = []
    if not devices:
        return None
    if visible_cores and (cores := _indices(visible_cores)) is not None:
        return Accelerators("Neuron core", len(cores), f"NEURON_RT_VISIBLE_CORES={visible_cores}")
    if (
        visible_devices
        and visible_devices.strip().lower() != "all"
        and (named := _indices(visible_devices)) is not None
    ):
        devices = [index for index in devices if index in named]
        if not devices:
            return None
    counts = [
        _read(Path(sys_root) / "devices/virtual/neuron_device" / f"neuron{index}" / "core_count") for index in devices
    ]
    digits = [count for count in counts if count and count.isdigit()]
    if len(digits) != len(counts):
        return Accelerators("Neuron core", None, f"{len(devices)} /dev/neuronN devices, core count unreadable")
    fused = (
        int(logical_nc_config)
        if logical_nc_config and logical_nc_config.strip().isdigit() and int(logical_nc_config) > 0
        else 1
    )
    total = sum(int(count) for count in digits) // fused
    return Accelerators(
        "Neuron core",
        total,
        f"{len(devices)} /dev/neuronN devices x sysfs core_count"
        + (f" / NEURON_LOGICAL_NC_CONFIG={fused}" if fused > 1 else ""),
    )


def gaudi_accelerators(visible_devices: str | None, dev_root: str | Path = "/dev") -> Accelerators | None:
    """Intel Gaudi HPUs: ``/dev/accel/accelN`` (``/dev/hlN`` with older drivers), narrowed by
    ``HABANA_VISIBLE_DEVICES`` (``all`` or indices). The accel class also serves other kinds of
    accelerator; a training container that has such nodes and no Gaudi is not expected."""
    root = Path(dev_root)
    count = 0
    for directory, pattern in ((root / "accel", _GAUDI_DEVICE), (root, _GAUDI_LEGACY_DEVICE)):
        with contextlib.suppress(OSError):
            count = count or sum(1 for name in os.listdir(directory) if pattern.match(name))
    if not count:
        return None
    how = "/dev/accel/accelN"
    if visible_devices is not None:
        value = visible_devices.strip().lower()
        if value in ("", "none", "void"):
            return None
        if value != "all" and (named := _indices(value)) is not None:
            count = min(count, len(named))
            how = f"HABANA_VISIBLE_DEVICES={visible_devices}"
    return Accelerators("Gaudi HPU", count, how)


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
    """Read the real host. ``host_env`` is :class:`launcher.core.settings.HostEnv`."""
    nvidia = nvidia_accelerators(host_env.cuda_visible_devices, host_env.nvidia_visible_devices)
    return HostFacts(
        hostname=host_env.hostname or socket.gethostname(),  # Kubernetes sets HOSTNAME to the pod name
        gpu_count=nvidia.count if nvidia and nvidia.count else 0,
        cpu_quota=cgroup_cpu_quota(),
        cpu_affinity=cpu_affinity(),
        omp_num_threads_set=bool(host_env.omp_num_threads),
        accelerators=nvidia
        or neuron_accelerators(
            host_env.neuron_rt_visible_cores, host_env.aws_neuron_visible_devices, host_env.neuron_logical_nc_config
        )
        or gaudi_accelerators(host_env.habana_visible_devices),
    )


def resolve_nproc(requested: str | int, host: HostFacts, source: str) -> tuple[int, str]:
    """``auto``/``gpu``/``cpu`` -> a process count, and how it was found. ``auto`` is one process
    per visible accelerator (NVIDIA, MIG, Neuron core, Gaudi), else per CPU of the cgroup quota
    (torchrun's ``cpu`` and CPU ``auto`` count every host CPU, quota or not)."""
    if isinstance(requested, int):
        return requested, source if source.startswith(("PET_", "-")) else "default"
    accelerators = host.accelerator
    if requested == "auto" and accelerators is not None and accelerators.count:
        return (
            accelerators.count,
            f"{source}=auto: {accelerators.count} visible {accelerators.kind}s ({accelerators.how})",
        )
    if requested == "gpu" and host.gpu_count > 0:
        return host.gpu_count, f"{source}={requested}: {host.gpu_count} visible GPUs"
    if requested == "gpu":
        raise ConfigError(
            source, requested, "at least one visible GPU (found no /dev/nvidiaN, or CUDA_VISIBLE_DEVICES hides them)"
        )
    how = f"CPU quota {host.cpus:g}" if host.cpu_quota is not None else f"{host.cpu_affinity} CPUs"
    return host.whole_cpus, f"{source}={requested}: {how}"
