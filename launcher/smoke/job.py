"""``trainer-launcher smoke``: a preflight of this node with thresholds; a table or JSON.

Each check is pass, warn, fail or skip, and says whether a failure means the pod is
misconfigured (permanent, exit 2) or the node is broken (retryable, exit 138).
"""

from __future__ import annotations

import json
import socket
import sys
import time
from dataclasses import asdict, dataclass

from launcher.core import settings
from launcher.core.devices import probe_host
from launcher.core.outcome import CONFIG_ERROR, TRANSIENT, ConfigError, Outcome
from launcher.core.report import run_command
from launcher.core.settings import HostEnv, Override
from launcher.smoke.settings import SmokeSettings
from launcher.torch.settings import TorchSettings


@dataclass
class Check:
    name: str
    status: str  # pass | warn | fail | skip
    value: str
    threshold: str = ""
    kind: str = "node"  # what a failure means: node (retryable) or config (permanent)


def _at_least(name: str, value: float | None, minimum: float, unit: str, kind: str, on_low: str = "fail") -> Check:
    if value is None:
        return Check(name, "skip", "not readable", f">= {minimum:g} {unit}", kind)
    return Check(name, "pass" if value >= minimum else on_low, f"{value:,.1f} {unit}", f">= {minimum:g} {unit}", kind)


def run_checks(smoke: SmokeSettings, torch_settings: TorchSettings, host) -> list[Check]:
    from launcher.smoke import probes as probe
    from launcher.torch.plan import resolve_nproc

    checks: list[Check] = []
    try:
        source = settings.source_of(TorchSettings, "nproc_per_node") or "default"
        nproc, how = resolve_nproc(torch_settings.nproc_per_node, host, source)
    except ConfigError as error:
        return [Check("nproc", "fail", str(error), kind="config")]
    gpus = probe.gpu_count()
    if gpus:
        checks.append(Check("visible GPUs vs nproc", "pass" if gpus >= nproc else "fail",
                            f"{gpus} GPUs for {nproc} processes ({how})", ">= nproc", "config"))
    else:
        checks.append(Check("CPU quota vs nproc", "pass" if host.cpus >= nproc else "warn",
                            f"{host.cpus:g} CPUs for {nproc} processes ({how})", ">= nproc", "config"))
    checks.append(_at_least("/dev/shm size", probe.shm_gb(), smoke.min_shm_gb, "GB", "config"))
    checks.append(_at_least("free space on /workspace", probe.disk_gb("/workspace"), smoke.min_free_gb, "GB",
                            "config", on_low="warn"))
    if torch_settings.master_addr:
        try:
            socket.getaddrinfo(torch_settings.master_addr, None)
            checks.append(Check("master address resolves", "pass", torch_settings.master_addr))
        except (socket.gaierror, UnicodeError) as error:
            checks.append(Check("master address resolves", "fail", f"{torch_settings.master_addr}: {error}"))
    else:
        checks.append(Check("master address resolves", "skip", "PET_MASTER_ADDR is unset"))
    checks.append(_at_least("CPU fp32 matmul", probe.cpu_matmul_gflops(), smoke.min_matmul_gflops, "GFLOP/s", "node"))
    ranks = max(2, min(nproc, 4)) if not gpus else 0
    if ranks:
        seconds, correct, _ = probe.allreduce(ranks, "gloo", numel=1 << 20)
        checks.append(Check(f"gloo all-reduce, {ranks} local ranks", "pass" if correct else "fail",
                            f"{'correct' if correct else 'WRONG SUM'}, {seconds * 1e3:.1f} ms for 4 MB"))
    for device in range(gpus):
        checks.append(_at_least(f"GPU {device} bf16 matmul 8192^3", probe.gpu_bf16_tflops(device),
                                smoke.min_bf16_tflops, "TFLOP/s", "node"))
        checks.append(_at_least(f"GPU {device} device-to-device copy", probe.gpu_copy_gbps(device),
                                smoke.min_copy_gbps, "GB/s", "node"))
    if gpus >= 2:
        seconds, correct, busbw = probe.allreduce(gpus, "nccl", numel=1 << 26)
        check = _at_least(f"NCCL all-reduce, {gpus} GPUs", busbw, smoke.min_busbw_gbps, "GB/s busbw", "node")
        checks.append(check if correct else Check(check.name, "fail", "WRONG SUM"))
    elif gpus == 1:
        checks.append(Check("NCCL all-reduce", "skip", "one GPU: nothing to reduce across"))
    if gpus:
        errors = probe.uncorrected_ecc_errors()
        if errors is None:
            checks.append(Check("uncorrected ECC errors", "skip", "nvidia-smi not readable"))
        else:
            checks.append(Check("uncorrected ECC errors", "pass" if not any(errors) else "fail",
                                ", ".join(map(str, errors)), "0"))
    return checks


def outcome_of(checks: list[Check]) -> Outcome:
    failed = [c for c in checks if c.status == "fail"]
    if not failed:
        warned = [c.name for c in checks if c.status == "warn"]
        return Outcome(0, "Succeeded", "preflight passed" + (f" with warnings: {', '.join(warned)}" if warned else ""))
    names = ", ".join(f"{c.name} ({c.value})" for c in failed)
    if any(c.kind == "config" for c in failed):
        return Outcome(CONFIG_ERROR, "Misconfigured", f"preflight failed: {names}")
    return Outcome(TRANSIENT, "NodeFault", f"preflight failed: {names}")


def table(checks: list[Check]) -> str:
    rows = [("CHECK", "STATUS", "VALUE", "THRESHOLD")] + [(c.name, c.status.upper(), c.value, c.threshold) for c in checks]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    return "\n".join(f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]}".rstrip() for r in rows)


def run_smoke(launcher_overrides: dict[str, Override], smoke_overrides: dict[str, Override], as_json: bool) -> int:
    return run_command(launcher_overrides, lambda launcher: _smoke(smoke_overrides, as_json))


def _smoke(smoke_overrides: dict[str, Override], as_json: bool) -> Outcome:
    smoke = settings.load(SmokeSettings, smoke_overrides)
    torch_settings = settings.load(TorchSettings)
    host = probe_host(settings.load(HostEnv))
    started = time.monotonic()
    checks = run_checks(smoke, torch_settings, host)
    outcome = outcome_of(checks).with_extra(checks=[asdict(c) for c in checks], node=host.hostname)
    if as_json:
        print(json.dumps({"node": host.hostname, "seconds": round(time.monotonic() - started, 2),
                          "checks": [asdict(c) for c in checks], "exitCode": outcome.exit_code}, indent=2))
    else:
        print(table(checks))
    sys.stdout.flush()
    return outcome
