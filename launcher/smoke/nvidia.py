"""What the driver says about each GPU: one ``nvidia-smi -q -x`` run, parsed into
:class:`GpuInfo`. Never raises: a missing, failing or hung ``nvidia-smi`` gives an
:class:`Inventory` with no GPUs and the reason.

The XML's element names changed across drivers, and both spellings are read:
``clocks_throttle_reasons/clocks_throttle_reason_*`` (before R535) and
``clocks_event_reasons/clocks_event_reason_*`` (after); ECC counts as
``single_bit``/``double_bit`` per memory structure (before Ampere-era drivers), as
``sram_uncorrectable``/``dram_uncorrectable``, or with SRAM split into
``sram_uncorrectable_parity`` + ``sram_uncorrectable_secded`` (R550 on); temperatures as absolute
``gpu_temp_max_gpu_threshold`` & co, or (R570 on) as margins to T.Limit,
``gpu_temp_tlimit`` and ``gpu_temp_max_gpu_tlimit_threshold`` & co. A field the driver does
not report ("N/A", absent) is None.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, field

COMMAND = ("nvidia-smi", "-q", "-x")
# A healthy driver answers -q -x for 8 GPUs in about a second; one that takes this long is
# stuck on a GPU, and the preflight must still finish.
TIMEOUT_S = 20.0

# Clock event reasons, by the suffix both spellings share.
REASONS = (
    "gpu_idle",
    "applications_clocks_setting",
    "sw_power_cap",
    "hw_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "sync_boost",
    "sw_thermal_slowdown",
    "display_clocks_setting",
)


@dataclass
class GpuInfo:
    index: int  # nvidia-smi's index: the order it lists GPUs in
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None  # "00000000:3B:00.0"
    memory_mib: int | None = None
    temp_c: float | None = None
    max_operating_c: float | None = None  # the GPU's own maximum operating temperature
    slowdown_c: float | None = None
    shutdown_c: float | None = None
    memory_temp_c: float | None = None
    memory_max_c: float | None = None
    clock_events: tuple[str, ...] | None = None  # active REASONS; None: not reported
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    remapped_correctable: int | None = None
    remapped_uncorrectable: int | None = None
    ecc_enabled: bool | None = None
    volatile_sram_uncorrectable: int | None = None
    volatile_dram_uncorrectable: int | None = None
    aggregate_sram_uncorrectable: int | None = None
    aggregate_dram_uncorrectable: int | None = None
    sram_threshold_exceeded: bool | None = None
    recovery_action: str | None = None  # "None", "Reset", "Reboot", "Drain P2P", "Drain and Reset"

    def label(self) -> str:
        """How a result names this GPU: its index and, where known, its PCI bus id."""
        return f"GPU {self.index} ({self.pci_bus_id})" if self.pci_bus_id else f"GPU {self.index}"


@dataclass
class Inventory:
    gpus: list[GpuInfo] = field(default_factory=list)
    reason: str = ""  # why there are no GPUs, when there are none
    driver_version: str | None = None


def run_bounded(argv: Sequence[str], timeout: float) -> tuple[int | None, str, str]:
    """(exit code, stdout, error) of a command that may hang. Output goes to a file, not a pipe,
    and the command runs in its own session that is killed whole on timeout: a pipe held open by
    a grandchild, or a child stuck in the kernel, cannot hold the preflight. The exit code is
    None with the reason in ``error`` when the command could not run or finish."""
    name = argv[0]
    try:
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            try:
                process = subprocess.Popen(
                    list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True
                )
            except FileNotFoundError:
                return None, "", f"{name} not found"
            except PermissionError:
                return None, "", f"{name} is not executable (permission denied)"
            except OSError as error:
                return None, "", f"{name} could not start: {error.strerror or error}"
            try:
                code = process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(OSError):
                    os.killpg(process.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):  # stuck in the kernel: left to init,
                    process.wait(timeout=2)  # the answer does not wait for it
                return None, "", f"{name} did not answer within {timeout:g} s"
            out.seek(0)
            err.seek(0)
            stdout = out.read().decode("utf-8", "replace")
            stderr = err.read().decode("utf-8", "replace").strip()
            return code, stdout, stderr
    except OSError as error:  # no temporary directory
        return None, "", f"{name} could not run: {error.strerror or error}"


def read(command: Sequence[str] = COMMAND, timeout: float = TIMEOUT_S) -> Inventory:
    """Every GPU the driver lists, or none and why."""
    code, stdout, error = run_bounded(command, timeout)
    shown = " ".join(command)
    if code is None:
        return Inventory(reason=error)
    if code != 0:
        first = next((line.strip() for line in (error or stdout).splitlines() if line.strip()), "")
        return Inventory(reason=f"{shown} exited {code}" + (f": {first}" if first else ""))
    return parse(stdout, shown)


def parse(text: str, source: str = "nvidia-smi -q -x") -> Inventory:
    """The GPUs in ``nvidia-smi -q -x`` output."""
    try:
        # The output names a DTD that is not on disk; ElementTree never fetches it.
        root = ET.fromstring(text.strip())
    except ET.ParseError as error:
        return Inventory(reason=f"{source} printed no parsable XML ({error})")
    if root.tag != "nvidia_smi_log":
        return Inventory(reason=f"{source} printed <{root.tag}>, not <nvidia_smi_log>")
    gpus = [_gpu(index, node) for index, node in enumerate(root.findall("gpu"))]
    return Inventory(
        gpus=gpus, reason="" if gpus else f"{source} lists no GPUs", driver_version=_text(root, "driver_version")
    )


def _text(node: ET.Element | None, path: str) -> str | None:
    """The element's text; None when absent, empty or one of the driver's not-available words."""
    if node is None:
        return None
    found = node.find(path)
    if found is None or found.text is None:
        return None
    text = found.text.strip()
    if not text or text in ("N/A", "Unknown Error", "Not Supported", "[N/A]") or "deprecated" in text.lower():
        return None
    return text


_NUMBER = re.compile(r"^-?\d+(\.\d+)?")


def _number(node: ET.Element | None, path: str) -> float | None:
    """ "87 C" -> 87.0, "81559 MiB" -> 81559.0."""
    text = _text(node, path)
    match = _NUMBER.match(text) if text else None
    return float(match.group()) if match else None


def _count(node: ET.Element | None, path: str) -> int | None:
    value = _number(node, path)
    return int(value) if value is not None else None


def _yes(node: ET.Element | None, path: str) -> bool | None:
    text = _text(node, path)
    if text is None:
        return None
    return text.lower() in ("yes", "active", "enabled", "true")


def _sum(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _gpu(index: int, node: ET.Element) -> GpuInfo:
    gpu = GpuInfo(
        index=index,
        name=_text(node, "product_name"),
        uuid=_text(node, "uuid"),
        pci_bus_id=_text(node, "pci/pci_bus_id") or node.get("id"),
        memory_mib=_count(node, "fb_memory_usage/total"),
        recovery_action=_text(node, "gpu_recovery_action"),
    )
    _temperatures(gpu, node.find("temperature"))
    gpu.clock_events = _clock_events(node)
    remap = node.find("remapped_rows")
    gpu.remap_pending = _yes(remap, "remapped_row_pending")
    gpu.remap_failure = _yes(remap, "remapped_row_failure")
    gpu.remapped_correctable = _count(remap, "remapped_row_corr")
    gpu.remapped_uncorrectable = _count(remap, "remapped_row_unc")
    gpu.ecc_enabled = _yes(node, "ecc_mode/current_ecc")
    ecc = node.find("ecc_errors")
    gpu.volatile_sram_uncorrectable, gpu.volatile_dram_uncorrectable = _uncorrectable(ecc, "volatile")
    gpu.aggregate_sram_uncorrectable, gpu.aggregate_dram_uncorrectable = _uncorrectable(ecc, "aggregate")
    gpu.sram_threshold_exceeded = _yes(ecc, "aggregate/sram_threshold_exceeded")
    return gpu


def _temperatures(gpu: GpuInfo, temps: ET.Element | None) -> None:
    gpu.temp_c = _number(temps, "gpu_temp")
    gpu.memory_temp_c = _number(temps, "memory_temp")
    gpu.max_operating_c = _number(temps, "gpu_temp_max_gpu_threshold")
    gpu.slowdown_c = _number(temps, "gpu_temp_slow_threshold")
    gpu.shutdown_c = _number(temps, "gpu_temp_max_threshold")
    gpu.memory_max_c = _number(temps, "gpu_temp_max_mem_threshold")
    # Newer drivers report the margin to T.Limit (positive while cool) and each threshold as a
    # margin: too hot once the margin drops below it. In absolute terms that threshold is
    # temperature + margin - threshold margin.
    margin = _number(temps, "gpu_temp_tlimit")
    if gpu.temp_c is None or margin is None:
        return
    limit = gpu.temp_c + margin
    for attribute, element in (
        ("max_operating_c", "gpu_temp_max_gpu_tlimit_threshold"),
        ("slowdown_c", "gpu_temp_slow_tlimit_threshold"),
        ("shutdown_c", "gpu_temp_max_tlimit_threshold"),
    ):
        offset = _number(temps, element)
        if getattr(gpu, attribute) is None and offset is not None:
            setattr(gpu, attribute, limit - offset)


def _clock_events(node: ET.Element) -> tuple[str, ...] | None:
    for block, prefix in (
        ("clocks_event_reasons", "clocks_event_reason_"),
        ("clocks_throttle_reasons", "clocks_throttle_reason_"),
    ):
        found = node.find(block)
        if found is None:
            continue
        states = {reason: _yes(found, prefix + reason) for reason in REASONS}
        if all(state is None for state in states.values()):
            return None
        return tuple(reason for reason, active in states.items() if active)
    return None


# Pre-Ampere layout: per-structure single/double bit counts. device_memory is DRAM; every
# other structure (register file, L1, L2, texture, CBU, SRAM) is on-chip SRAM.
_OLD_TOTALS = ("total",)


def _uncorrectable(ecc: ET.Element | None, scope: str) -> tuple[int | None, int | None]:
    """(SRAM, DRAM) uncorrectable error counts of ``volatile`` or ``aggregate``."""
    block = ecc.find(scope) if ecc is not None else None
    if block is None:
        return None, None
    double = block.find("double_bit")
    if double is not None:
        dram = _count(double, "device_memory")
        sram = _sum([_count(double, child.tag) for child in double if child.tag not in ("device_memory", *_OLD_TOTALS)])
        if dram is None and sram is None:  # only a total: call it DRAM, where DBEs mostly land
            dram = _count(double, "total")
        return sram, dram
    sram = _count(block, "sram_uncorrectable")
    if sram is None:
        sram = _sum([_count(block, "sram_uncorrectable_parity"), _count(block, "sram_uncorrectable_secded")])
    return sram, _count(block, "dram_uncorrectable")
