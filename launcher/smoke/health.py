"""The node's health as the driver, the kernel log and sysfs report it: one aggregated check per
kind, each naming the bad GPUs (index and PCI bus id) or ports in ``detail``. Pure: the readings
come from :mod:`launcher.smoke.nvidia`, :mod:`launcher.smoke.kernel` and
:mod:`launcher.smoke.rdma`. A reading nobody could take is a SKIP with the reason.

Check names are stable (JSON consumers key on them); every check is always present.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from launcher.smoke.kernel import XidLog
from launcher.smoke.nvidia import GpuInfo, Inventory
from launcher.smoke.rdma import PortScan
from launcher.smoke.result import FAIL, PASS, SKIP, WARN, Check, Threshold

THROTTLE = "GPU clock throttling"
TEMPERATURE = "GPU temperature"
MEMORY_TEMPERATURE = "GPU memory temperature"
ROW_REMAPPING = "GPU row remapping"
SRAM = "GPU uncorrectable SRAM errors"
ECC = "GPU uncorrectable ECC errors (volatile)"
RECOVERY = "GPU recovery action"
XIDS = "GPU XID errors in the kernel log"
RDMA = "RDMA ports"
NAMES = (THROTTLE, TEMPERATURE, MEMORY_TEMPERATURE, ROW_REMAPPING, SRAM, ECC, RECOVERY, XIDS, RDMA)

# Clock event reasons that mean the hardware protects itself (NVML's nvmlClocksEventReason*):
# the GPU runs at a fraction of its clocks until the cause (heat, power delivery) goes away.
BAD_REASONS = {
    "hw_slowdown": "HW slowdown active",
    "hw_thermal_slowdown": "HW thermal slowdown active",
    "hw_power_brake_slowdown": "HW power brake slowdown active",
    "sw_thermal_slowdown": "SW thermal slowdown active",
}
# What a healthy GPU shows: idle, held to its power limit, or clocks someone set.
BENIGN_REASONS = {
    "gpu_idle": "idle",
    "sw_power_cap": "SW power cap",
    "applications_clocks_setting": "applications clocks setting",
    "sync_boost": "sync boost",
    "display_clocks_setting": "display clocks setting",
}
RECOVERY_ADVICE = {
    "Reset": "reset the GPU",
    "Reboot": "reboot the node",
    "Drain P2P": "drain peer-to-peer traffic",
    "Drain and Reset": "drain peer-to-peer traffic, then reset the GPU",
}


def health_checks(
    inventory: Inventory | list[GpuInfo], xids: XidLog, ports: PortScan, sku, max_temp: Threshold | None = None
) -> list[Check]:
    """Throttling, temperatures, row remapping, SRAM and volatile ECC errors, recovery action
    (from nvidia-smi); XIDs (kernel log); RDMA ports (sysfs). ``sku`` supplies the fallback
    maximum temperature; ``max_temp``, when given (a flag or variable), replaces every GPU's."""
    if isinstance(inventory, list):
        inventory = Inventory(gpus=inventory, reason="" if inventory else "no GPUs")
    gpus = inventory.gpus
    if gpus:
        checks = [
            throttle_check(gpus),
            temperature_check(gpus, sku, max_temp),
            memory_temperature_check(gpus),
            row_remap_check(gpus),
            sram_check(gpus),
            ecc_check(gpus),
            recovery_check(gpus),
        ]
    else:
        why = inventory.reason or "no GPUs"
        checks = [Check(name, SKIP, detail=why) for name in NAMES[:7]]
    checks.append(xid_check(xids, gpus))
    checks.append(rdma_check(ports))
    return checks


def _unreported(name: str, what: str) -> Check:
    return Check(name, SKIP, detail=f"no GPU reports {what}")


def throttle_check(gpus: list[GpuInfo]) -> Check:
    source = "NVML clock event reasons (fail: HW slowdown, HW thermal, HW power brake, SW thermal)"
    reporting = [g for g in gpus if g.clock_events is not None]
    if not reporting:
        return _unreported(THROTTLE, "clock event reasons")
    bad: list[str] = []
    benign: Counter[str] = Counter()
    for gpu in reporting:
        events = gpu.clock_events or ()
        reasons = [BAD_REASONS[r] for r in events if r in BAD_REASONS]
        if reasons:
            bad.append(f"{gpu.label()}: {', '.join(reasons)}")
        benign.update(BENIGN_REASONS[r] for r in events if r in BENIGN_REASONS)
    if bad:
        return Check(THROTTLE, FAIL, len(bad), 0, "GPUs", source, detail="; ".join(bad))
    detail = ", ".join(f"{reason} on {count}" for reason, count in sorted(benign.items()))
    return Check(THROTTLE, PASS, 0, 0, "GPUs", source, detail=detail and f"benign: {detail}")


def _limit(gpu: GpuInfo, sku, override: Threshold | None) -> tuple[float | None, str]:
    if override is not None:
        return override.value, override.source
    if gpu.max_operating_c is not None:
        return gpu.max_operating_c, "the GPU's maximum operating temperature (nvidia-smi)"
    fallback = getattr(sku, "max_temp_c", None)
    if fallback is not None:
        return fallback.value, fallback.source
    return None, ""


def _temperatures(name: str, readings: list[tuple[GpuInfo, float, float, str]], what: str) -> Check:
    """One check over (gpu, reading, limit, source): the GPU closest to its limit is the value;
    every GPU above its limit is named."""
    if not readings:
        return _unreported(name, what)
    gpu, value, limit, source = min(readings, key=lambda r: r[2] - r[1])
    hot = [f"{g.label()} {v:g} C, above {lim:g} C" for g, v, lim, _ in readings if v > lim]
    if hot:
        return Check(name, FAIL, value, limit, "C", source, detail="; ".join(hot))
    return Check(name, PASS, value, limit, "C", source, detail=f"closest to its limit: {gpu.label()}")


def temperature_check(gpus: list[GpuInfo], sku, override: Threshold | None = None) -> Check:
    readings = []
    for gpu in gpus:
        limit, source = _limit(gpu, sku, override)
        if gpu.temp_c is not None and limit is not None:
            readings.append((gpu, gpu.temp_c, limit, source))
    return _temperatures(TEMPERATURE, readings, "its temperature")


def memory_temperature_check(gpus: list[GpuInfo]) -> Check:
    readings = [
        (g, g.memory_temp_c, g.memory_max_c, "the memory's maximum operating temperature (nvidia-smi)")
        for g in gpus
        if g.memory_temp_c is not None and g.memory_max_c is not None
    ]
    return _temperatures(MEMORY_TEMPERATURE, readings, "memory temperature and its maximum")


def row_remap_check(gpus: list[GpuInfo]) -> Check:
    source = "NVIDIA A100/H100 memory error management: pending needs a GPU reset, failure an RMA"
    reporting = [g for g in gpus if g.remap_pending is not None or g.remap_failure is not None]
    if not reporting:
        return _unreported(ROW_REMAPPING, "row remapping (pre-Ampere GPU, or driver without it)")
    bad = []
    for gpu in reporting:
        if gpu.remap_failure:
            bad.append(f"{gpu.label()}: row remapping failed")
        if gpu.remap_pending:
            bad.append(f"{gpu.label()}: row remapping pending (applies at the next GPU reset)")
    count = len({item.split(":")[0] for item in bad})
    return Check(ROW_REMAPPING, FAIL if bad else PASS, count, 0, "GPUs", source, detail="; ".join(bad))


def sram_check(gpus: list[GpuInfo]) -> Check:
    source = "uncorrectable SRAM ECC errors since the driver loaded (volatile)"
    reporting = [
        g
        for g in gpus
        if g.volatile_sram_uncorrectable is not None
        or g.sram_threshold_exceeded is not None
        or g.aggregate_sram_uncorrectable is not None
    ]
    if not reporting:
        return _unreported(SRAM, "SRAM ECC counts (ECC off or not supported)")
    failed, warned, total = [], [], 0
    for gpu in reporting:
        volatile = gpu.volatile_sram_uncorrectable or 0
        total += volatile
        if volatile:
            failed.append(f"{gpu.label()}: {volatile} uncorrectable SRAM errors since the driver loaded")
        if gpu.sram_threshold_exceeded:
            failed.append(f"{gpu.label()}: SRAM uncorrectable error threshold exceeded")
        elif not volatile and gpu.aggregate_sram_uncorrectable:
            warned.append(
                f"{gpu.label()}: {gpu.aggregate_sram_uncorrectable} uncorrectable SRAM errors in its lifetime"
            )
    status = FAIL if failed else WARN if warned else PASS
    return Check(SRAM, status, total, 0, "errors", source, detail="; ".join(failed + warned))


def ecc_check(gpus: list[GpuInfo]) -> Check:
    source = "uncorrectable DRAM ECC errors since the driver loaded (volatile)"
    reporting = [g for g in gpus if g.volatile_dram_uncorrectable is not None]
    if not reporting:
        return _unreported(ECC, "volatile ECC counts (ECC off or not supported)")
    bad = [
        f"{g.label()}: {g.volatile_dram_uncorrectable} uncorrectable memory errors since the driver loaded"
        for g in reporting
        if g.volatile_dram_uncorrectable
    ]
    total = sum(g.volatile_dram_uncorrectable or 0 for g in reporting)
    return Check(ECC, FAIL if bad else PASS, total, 0, "errors", source, detail="; ".join(bad))


def recovery_check(gpus: list[GpuInfo]) -> Check:
    source = "NVML GPU recovery action (anything but None)"
    reporting = [g for g in gpus if g.recovery_action is not None]
    if not reporting:
        return _unreported(RECOVERY, "a recovery action (driver before R550?)")
    bad = [
        f"{g.label()}: {g.recovery_action}"
        + (f" ({RECOVERY_ADVICE[g.recovery_action]})" if g.recovery_action in RECOVERY_ADVICE else "")
        for g in reporting
        if g.recovery_action != "None"
    ]
    return Check(RECOVERY, FAIL if bad else PASS, len(bad), 0, "GPUs", source, detail="; ".join(bad))


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "at an unknown time"
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


def _bus(pci: str | None) -> tuple[int, int, int] | None:
    """(domain, bus, device) of "0000:3b:00" (an XID's) or "00000000:3B:00.0" (nvidia-smi's)."""
    if not pci:
        return None
    parts = pci.split(".")[0].split(":")
    try:
        numbers = [int(p, 16) for p in parts]
    except ValueError:
        return None
    if len(numbers) == 2:
        numbers = [0, *numbers]
    return (numbers[-3], numbers[-2], numbers[-1]) if len(numbers) >= 3 else None


def _window(seconds: float) -> str:
    return f"{seconds / 3600:g} h" if seconds >= 3600 else f"{seconds:g} s"


def xid_check(xids: XidLog, gpus: Iterable[GpuInfo] = ()) -> Check:
    if not xids.readable:
        return Check(XIDS, SKIP, detail=xids.reason)
    source = f"NVIDIA Xid catalog; last {_window(xids.window_s)} of {xids.source}"
    if not xids.events:
        return Check(XIDS, PASS, 0, 0, "XIDs", source)
    by_bus = {_bus(g.pci_bus_id): g for g in gpus if _bus(g.pci_bus_id)}
    groups: dict[tuple[str, int], list] = {}
    for event in xids.events:
        groups.setdefault((event.pci, event.xid), []).append(event)
    lines = []
    # Hardware XIDs first, then the most recent.
    for (pci, xid), events in sorted(
        groups.items(),
        key=lambda item: (
            item[1][0].severity != "fail",
            min((e.age_s for e in item[1] if e.age_s is not None), default=1e18),
        ),
    ):
        latest = min((e.age_s for e in events if e.age_s is not None), default=None)
        gpu = by_bus.get(_bus(pci))
        where = gpu.label() if gpu else f"PCI {pci}"
        times = f" x{len(events)}" if len(events) > 1 else ""
        lines.append(f"Xid {xid} ({events[0].meaning}) on {where}, {_ago(latest)}{times}")
    status = FAIL if any(e.severity == "fail" for e in xids.events) else WARN
    return Check(XIDS, status, len(xids.events), 0, "XIDs", source, detail="; ".join(lines))


def rdma_check(scan: PortScan) -> Check:
    if not scan.ports:
        return Check(RDMA, SKIP, detail=scan.reason or "no RDMA ports")
    source = "sysfs port state: ACTIVE and LinkUp"
    total = len(scan.ports)
    up = [p for p in scan.ports if p.up]
    down = [
        f"{p.name}: {p.state or 'state unreadable'}" + (f" ({p.phys_state})" if p.phys_state else "")
        for p in scan.ports
        if not p.up
    ]
    if down:
        return Check(RDMA, FAIL, len(up), total, "ports ACTIVE", source, op=">=", detail="; ".join(down))
    # Ports of one link layer normally train to one speed; one that came up slower has a bad
    # cable or transceiver and slows every collective that crosses it.
    slow = []
    for layer in {p.link_layer for p in up}:
        rates = [p.gbps for p in up if p.link_layer == layer and p.gbps is not None]
        if not rates:
            continue
        usual = Counter(rates).most_common(1)[0][0]
        slow += [
            f"{p.name} at {p.rate}, others {usual:g} Gb/sec"
            for p in up
            if p.link_layer == layer and p.gbps is not None and p.gbps < usual
        ]
    if slow:
        return Check(RDMA, WARN, len(up), total, "ports ACTIVE", source, op=">=", detail="; ".join(sorted(slow)))
    shown = sorted({p.rate for p in up if p.rate})
    return Check(RDMA, PASS, len(up), total, "ports ACTIVE", source, op=">=", detail=", ".join(shown))
