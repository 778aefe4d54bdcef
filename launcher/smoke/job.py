"""``trainer-launcher smoke``: a preflight of this node; a table or one JSON result per check.

The checks, in order: what the pod asks for against what it has (config: exit 2 when it
fails), the CPU, the GPUs' performance against their model's floors, and the node's health as
the driver, the kernel log and sysfs report it (node: exit 138, retryable elsewhere, when any
fails). ``--level long`` measures longer and with bigger messages.
"""

from __future__ import annotations

import json
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from launcher.core import settings
from launcher.core.devices import probe_host, resolve_nproc
from launcher.core.outcome import ConfigError, Outcome, Reasons
from launcher.core.report import run_command
from launcher.core.settings import HostEnv, Override
from launcher.smoke.result import FAIL, PASS, SKIP, WARN, Check, Threshold, at_least, sum_check
from launcher.smoke.settings import SmokeSettings
from launcher.smoke.thresholds import plain

MESSAGE_CHECKS = 6  # failed checks named in the one-line message; all of them are in the result
_SOURCE_WIDTH = 60


@dataclass(frozen=True)
class PodRequest:
    """What the controller asked of this pod, as the default framework's variables say it (the
    framework reads them: the preflight is given this, and knows no framework)."""

    nproc: str | int  # processes per node: a count, or auto, cpu, gpu
    nproc_source: str  # the variable or flag that gave it, or "default"
    master_addr: str | None
    master_addr_env: str  # the variable that names the master, said when it is unset


def pod_checks(
    smoke: SmokeSettings, request: PodRequest, host, gpus: int, probe, overrides: dict[str, Override] | None = None
) -> list[Check]:
    """What the pod asks for against what it has."""
    try:
        nproc, how = resolve_nproc(request.nproc, host, request.nproc_source)
    except ConfigError as error:
        return [Check("nproc", FAIL, kind="config", detail=str(error))]
    checks = []
    if gpus:
        checks.append(
            Check(
                "visible GPUs vs nproc",
                PASS if gpus >= nproc else FAIL,
                gpus,
                nproc,
                "GPUs",
                f"processes per node ({how})",
                "config",
                op=">=",
            )
        )
    else:
        checks.append(
            Check(
                "CPU quota vs nproc",
                PASS if host.cpus >= nproc else WARN,
                float(host.cpus),
                nproc,
                "CPUs",
                f"processes per node ({how})",
                "config",
                op=">=",
            )
        )
    checks.append(at_least("/dev/shm size", probe.shm_gb(), plain(smoke, "min_shm_gb", overrides), "GB", "config"))
    checks.append(
        at_least(
            "free space on /workspace",
            probe.disk_gb("/workspace"),
            plain(smoke, "min_free_gb", overrides),
            "GB",
            "config",
            on_low=WARN,
            unreadable="/workspace is not mounted",
        )
    )
    address = request.master_addr
    if address:
        try:
            socket.getaddrinfo(address, None)
            checks.append(Check("master address resolves", PASS, detail=address))
        except (socket.gaierror, UnicodeError) as error:
            checks.append(Check("master address resolves", FAIL, detail=f"{address}: {error}"))
    else:
        checks.append(Check("master address resolves", SKIP, detail=f"{request.master_addr_env} is unset"))
    return checks


def cpu_checks(
    smoke: SmokeSettings, level, nproc_hint: int, probe, overrides: dict[str, Override] | None = None
) -> list[Check]:
    checks = [
        at_least("CPU fp32 matmul", probe.cpu_matmul_gflops(), plain(smoke, "min_matmul_gflops", overrides), "GFLOP/s")
    ]
    ranks = max(2, min(nproc_hint, 4))
    seconds, correct, _ = probe.allreduce(ranks, "gloo", level.gloo_bytes)
    checks.append(
        sum_check(
            f"gloo all-reduce, {ranks} local ranks",
            correct,
            round(seconds * 1e3, 1),
            "ms",
            f"{level.gloo_bytes / (1 << 20):g} MiB",
        )
    )
    return checks


def _slowest(name: str, values: dict[str, float | None], floor: Threshold, unit: str) -> Check:
    """One check over many GPUs (or pairs): the slowest is the value, and every one below the
    floor is named."""
    measured = {who: v for who, v in values.items() if v is not None}
    if not measured:
        return Check(name, SKIP, None, floor.value, unit, floor.source, op=">=", detail="not measurable here")
    who, value = min(measured.items(), key=lambda item: item[1])
    low = [f"{w} {v:,.1f}" for w, v in measured.items() if v < floor.value]
    if low:
        return Check(
            name,
            FAIL,
            value,
            floor.value,
            unit,
            floor.source,
            op=">=",
            detail=f"below {floor.value:g} {unit}: " + ", ".join(low),
        )
    return Check(name, PASS, value, floor.value, unit, floor.source, op=">=", detail=f"slowest: {who}")


def gpu_checks(level, floors: dict[str, Threshold], gpus: int, probe) -> list[Check]:
    """Every GPU's compute, memory, host link and peer links, and the NCCL all-reduce over all."""
    devices = list(range(gpus))
    label = "GPU {}".format
    checks = [
        _slowest(
            "GPU bf16 matmul 8192^3",
            {label(d): v for d, v in probe.gpu_bf16_tflops(devices, level.matmul_seconds).items()},
            floors["bf16_tflops"],
            "TFLOP/s",
        ),
        _slowest(
            "GPU device-to-device copy",
            {label(d): probe.gpu_copy_gbps(d, level.copy_bytes) for d in devices},
            floors["copy_gbps"],
            "GB/s",
        ),
    ]
    host = {}
    for d in devices:
        to_device, to_host = probe.gpu_host_copy_gbps(d, level.host_bytes)
        host[f"{label(d)} host-to-device"] = to_device
        host[f"{label(d)} device-to-host"] = to_host
    checks.append(_slowest("GPU host<->device copy (pinned)", host, floors["h2d_gbps"], "GB/s"))
    if gpus >= 2:
        pairs = probe.gpu_peer_gbps(devices, level.host_bytes)
        check = _slowest(
            "GPU peer-to-peer copy",
            {f"GPU {s}->{t}": v for (s, t), (v, _) in pairs.items()},
            floors["p2p_gbps"],
            "GB/s",
        )
        without = [f"{s}->{t}" for (s, t), (_, access) in pairs.items() if not access]
        if without:
            check.detail += f"; no peer access: {', '.join(without)}"
        checks.append(check)
        _, correct, busbw = probe.allreduce(gpus, "nccl", level.allreduce_bytes, level.allreduce_iterations)
        check = at_least(f"NCCL all-reduce, {gpus} GPUs", busbw, floors["busbw_gbps"], "GB/s busbw")
        check.detail = f"{level.allreduce_bytes / (1 << 30):g} GiB messages"
        if not correct:  # a wrong sum fails whatever its speed
            check.status, check.detail = FAIL, f"WRONG SUM, {check.detail}"
        checks.append(check)
    else:
        checks.append(Check("GPU peer-to-peer copy", SKIP, detail="one GPU: no pair"))
        checks.append(Check("NCCL all-reduce", SKIP, detail="one GPU: nothing to reduce across"))
    return checks


def run_checks(
    smoke: SmokeSettings, request: PodRequest, host, overrides: dict[str, Override] | None = None
) -> tuple[list[Check], dict]:
    """Every check of this node, and what it found out about the node (its GPU model row, its
    GPUs, the driver)."""
    from launcher.smoke import health, kernel, nvidia, rdma, thresholds
    from launcher.smoke import probes as probe
    from launcher.smoke.skus import node_sku

    level = probe.LEVELS[smoke.level]
    gpus = probe.gpu_count()
    checks = pod_checks(smoke, request, host, gpus, probe, overrides)
    # The driver's view, whatever the image's libraries see: a node's health does not depend on them.
    inventory = nvidia.read()
    sku = node_sku(inventory.gpus)
    about = {"level": smoke.level, "gpus": gpus, "sku": sku.name, "driver": inventory.driver_version}
    if gpus:
        checks += gpu_checks(level, thresholds.gpu_floors(smoke, sku, gpus, overrides), gpus, probe)
    else:
        checks += cpu_checks(smoke, level, int(host.cpus), probe, overrides)
    checks += health.health_checks(
        inventory, kernel.read_xids(smoke.xid_window), rdma.read_ports(), sku, thresholds.max_temp(smoke, overrides)
    )
    return checks, about


def outcome_of(checks: list[Check]) -> Outcome:
    failed = [c for c in checks if c.status == FAIL]
    if not failed:
        warned = [c.name for c in checks if c.status == WARN]
        return Outcome.of(
            Reasons.SUCCEEDED, "preflight passed" + (f" with warnings: {', '.join(warned)}" if warned else "")
        )
    named = "; ".join(c.summary() for c in failed[:MESSAGE_CHECKS])
    if len(failed) > MESSAGE_CHECKS:
        named += f"; and {len(failed) - MESSAGE_CHECKS} more"
    if any(c.kind == "config" for c in failed):
        return Outcome.of(Reasons.MISCONFIGURED, f"preflight failed: {named}")
    return Outcome.of(Reasons.NODE_FAULT, f"preflight failed: {named}")


def table(checks: list[Check]) -> str:
    """A row per check; under a check that did not pass, what it found."""

    def source(check: Check) -> str:
        text = check.source if check.threshold is not None else ""
        return text if len(text) <= _SOURCE_WIDTH else text[: _SOURCE_WIDTH - 3] + "..."

    header = ("CHECK", "STATUS", "VALUE", "THRESHOLD", "SOURCE")
    rows = [
        (c.name + (f" [{c.node}]" if c.node else ""), c.status.upper(), c.shown_value(), c.shown_threshold(), source(c))
        for c in checks
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(4)]
    lines = []
    for row, check in zip([header, *rows], [None, *checks], strict=True):
        lines.append("  ".join(f"{cell:<{widths[i]}}" for i, cell in enumerate(row[:4])) + f"  {row[4]}".rstrip())
        if check is not None and check.detail and check.status != PASS:
            lines.append(f"    {check.detail}")
    return "\n".join(line.rstrip() for line in lines)


def run_smoke(
    launcher_overrides: dict[str, Override],
    smoke_overrides: dict[str, Override],
    as_json: bool,
    pod_request: Callable[[], PodRequest],
) -> int:
    """``pod_request``: reads (and validates) what the controller asked of this pod."""
    return run_command(launcher_overrides, lambda launcher: _smoke(smoke_overrides, as_json, pod_request))


def _smoke(smoke_overrides: dict[str, Override], as_json: bool, pod_request: Callable[[], PodRequest]) -> Outcome:
    smoke = settings.load(SmokeSettings, smoke_overrides)
    request = pod_request()
    host = probe_host(settings.load(HostEnv))
    started = time.monotonic()
    checks, about = run_checks(smoke, request, host, smoke_overrides)
    outcome = outcome_of(checks)
    # The termination message holds 4 KiB: the failed checks only; stdout has them all.
    failed = [c.as_json() for c in checks if c.status == FAIL]
    outcome = outcome.with_extra(node=host.hostname, sku=about["sku"], **({"failedChecks": failed} if failed else {}))
    if as_json:
        print(
            json.dumps(
                {
                    "node": host.hostname,
                    **about,
                    "seconds": round(time.monotonic() - started, 2),
                    "checks": [c.as_json() for c in checks],
                    "exitCode": outcome.exit_code,
                },
                indent=2,
            )
        )
    else:
        print(f"node {host.hostname}: {about['gpus']} GPUs, thresholds of {about['sku']}, level {about['level']}")
        print(table(checks))
    sys.stdout.flush()
    return outcome
