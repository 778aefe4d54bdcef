"""The preflight's floors per GPU model, each with where its figure comes from.

A floor is set below what a healthy GPU of that model measures, so that only a degraded one
fails: a throttled H100 still clears a generic 100 TFLOP/s, never 650. Figures named "measured"
were measured by this project (docs/smoke.md); the rest are vendors' published peaks and
the floors of the tools platform teams already gate nodes with (DCGM diagnostics, nccl-tests).
Flags and LAUNCHER_SMOKE_* variables override any floor (launcher.smoke.thresholds).

The model comes from the driver's product name (nvidia-smi's ``product_name``, NVML's
``nvmlDeviceGetName``) and, where the name leaves the memory size out, the memory. A look-alike
whose figures differ (L40 vs L40S, H800, GH200, A800) gets the generic row, never a wrong one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, fields, replace

from launcher.smoke.result import Threshold

FLOOR_FIELDS = ("bf16_tflops", "copy_gbps", "busbw_gbps", "h2d_gbps", "p2p_gbps")


@dataclass(frozen=True)
class Sku:
    name: str
    bf16_tflops: Threshold  # dense bf16 matmul, 8192^3, per GPU
    copy_gbps: Threshold  # device-to-device copy, bytes read + written, per GPU
    busbw_gbps: Threshold  # NCCL all-reduce bus bandwidth over the node's 8 GPUs, multi-GB messages
    h2d_gbps: Threshold  # pinned host<->device copy, the slower direction
    p2p_gbps: Threshold  # peer-to-peer copy, the slowest ordered pair of GPUs
    max_temp_c: Threshold  # used only where the driver reports no maximum operating temperature


def _t(value: float, source: str) -> Threshold:
    return Threshold(value, source)


_GEN5 = _t(48, "PCIe Gen5 x16: 64 GB/s raw, about 55 GB/s pinned in practice; floor 48")
_GEN4 = _t(22, "PCIe Gen4 x16: 32 GB/s raw, about 25 GB/s pinned in practice; floor 22")
_NVLINK4 = _t(316, "NVLink 4 through NVSwitch: 450 GB/s per direction peak, 330-370 measured by nvbandwidth; floor 316")
_NVLINK3 = _t(210, "NVLink 3 through NVSwitch: 300 GB/s per direction peak, about 250 measured; floor 210")
_PCIE_PEERS = _t(15, "peers over PCIe (no NVLink between every pair): 20-50 GB/s; floor 15")
_PCIE_BUSBW = _t(15, "8 GPUs without NVSwitch: the all-reduce crosses PCIe and the host bridges; floor 15")


def _temp(value: float, model: str) -> Threshold:
    return _t(value, f"{model}: the maximum operating temperature its drivers report")


H100_SXM = Sku(
    "H100 SXM",
    _t(
        560,
        "H100 SXM: 989 dense bf16 peak; this probe measured 677 over 30 s on a healthy one (709 in the quick "
        "level's seconds); floor 560, about 85% of the lowest sustained rate measured on an H100/H200",
    ),
    _t(1900, "H100 SXM: DCGM diag's memory bandwidth floor, 1.9 TB/s read+write (3.35 TB/s HBM3 peak; 3,002 measured)"),
    _t(460, "H100 SXM, 8 GPUs: nccl-tests all-reduce about 480 GB/s busbw at >= 4 GB; floor 460"),
    _GEN5,
    _NVLINK4,
    _temp(87, "H100 SXM"),
)
H200_SXM = Sku(
    "H200 SXM",
    _t(
        560,
        "H200 SXM: the H100's compute (989 dense bf16 peak); this probe measured 660 over 30 s on a healthy one "
        "(672 in the quick level's seconds); floor 560, as H100 SXM",
    ),
    _t(2600, "H200 SXM: 4.8 TB/s HBM3e peak, 1.43x the H100's; DCGM's H100 floor scaled, 2.6 TB/s"),
    _t(431, "H200 SXM, 8 GPUs: nccl-tests all-reduce busbw at >= 4 GB; floor 431"),
    _GEN5,
    _NVLINK4,
    _temp(87, "H200 SXM"),
)
H100_PCIE = Sku(
    "H100 PCIe",
    _t(400, "H100 PCIe: 756 dense bf16 peak at 350 W (NVIDIA datasheet); floor about 55% of peak"),
    _t(1150, "H100 PCIe: 2.0 TB/s HBM2e peak; DCGM's H100 floor scaled, 1.15 TB/s"),
    _PCIE_BUSBW,
    _GEN5,
    _PCIE_PEERS,
    _temp(85, "H100 PCIe"),
)
H100_NVL = Sku(
    "H100 NVL",
    _t(450, "H100 NVL: 835 dense bf16 peak (NVIDIA datasheet); floor about 55% of peak"),
    _t(2200, "H100 NVL: 3.9 TB/s HBM3 peak; DCGM's H100 floor scaled, 2.2 TB/s"),
    _PCIE_BUSBW,
    _GEN5,
    _t(15, "H100 NVL: NVLink bridges pair GPUs, the other pairs cross PCIe; floor 15"),
    _temp(85, "H100 NVL"),
)
H200_NVL = Sku(
    "H200 NVL",
    _t(450, "H200 NVL: 835 dense bf16 peak (NVIDIA datasheet); floor about 55% of peak"),
    _t(2600, "H200 NVL: 4.8 TB/s HBM3e peak; DCGM's H100 floor scaled, 2.6 TB/s"),
    _PCIE_BUSBW,
    _GEN5,
    _t(15, "H200 NVL: NVLink bridges join 2 or 4 GPUs, the other pairs cross PCIe; floor 15"),
    _temp(85, "H200 NVL"),
)
A100_SXM_40 = Sku(
    "A100 SXM 40GB",
    _t(230, "A100 SXM: 312 dense bf16 peak (NVIDIA datasheet), 250-280 at 8192^3; floor 230"),
    _t(1000, "A100 40GB: 1.555 TB/s HBM2 peak, 1.2-1.3 TB/s read+write measured; floor 1.0 TB/s"),
    _t(200, "A100 SXM, 8 GPUs: nccl-tests all-reduce about 230 GB/s busbw at >= 1 GB; floor 200"),
    _GEN4,
    _NVLINK3,
    _temp(85, "A100 SXM"),
)
A100_SXM_80 = Sku(
    "A100 SXM 80GB",
    _t(230, "A100 SXM: 312 dense bf16 peak (NVIDIA datasheet), 250-280 at 8192^3; floor 230"),
    _t(1300, "A100 80GB SXM: 2.04 TB/s HBM2e peak, about 1.6 TB/s read+write measured; floor 1.3 TB/s"),
    _t(200, "A100 SXM, 8 GPUs: nccl-tests all-reduce about 230 GB/s busbw at >= 1 GB; floor 200"),
    _GEN4,
    _NVLINK3,
    _temp(85, "A100 SXM"),
)
A100_PCIE_40 = Sku(
    "A100 PCIe 40GB",
    _t(230, "A100 PCIe: 312 dense bf16 peak (NVIDIA datasheet); floor as A100 SXM"),
    _t(1000, "A100 40GB: 1.555 TB/s HBM2 peak, 1.2-1.3 TB/s read+write measured; floor 1.0 TB/s"),
    _PCIE_BUSBW,
    _GEN4,
    _PCIE_PEERS,
    _temp(85, "A100 PCIe"),
)
A100_PCIE_80 = Sku(
    "A100 PCIe 80GB",
    _t(230, "A100 PCIe: 312 dense bf16 peak (NVIDIA datasheet); floor as A100 SXM"),
    _t(1250, "A100 80GB PCIe: 1.935 TB/s HBM2e peak; floor 1.25 TB/s"),
    _PCIE_BUSBW,
    _GEN4,
    _PCIE_PEERS,
    _temp(85, "A100 PCIe"),
)
L40S = Sku(
    "L40S",
    _t(200, "L40S: 362 dense bf16 peak (NVIDIA datasheet); floor about 55% of peak"),
    _t(550, "L40S: 864 GB/s GDDR6 peak; floor 550 read+write"),
    _t(10, "L40S: no NVLink, the all-reduce crosses PCIe; floor 10"),
    _GEN4,
    _t(10, "L40S: no NVLink, peers over PCIe; floor 10"),
    _temp(87, "L40S"),
)
L4 = Sku(
    "L4",
    _t(70, "L4: 121 dense bf16 peak at 72 W (NVIDIA datasheet); floor about 58% of peak"),
    _t(180, "L4: 300 GB/s GDDR6 peak; floor 180 read+write"),
    _t(5, "L4: no NVLink, the all-reduce crosses PCIe; floor 5"),
    _t(10, "L4: PCIe Gen4 x16, 72 W card; floor 10"),
    _t(5, "L4: no NVLink, peers over PCIe; floor 5"),
    _temp(85, "L4"),
)
GENERIC = Sku(
    "generic",
    _t(100, "generic: a GPU model without a row in launcher/smoke/skus.py"),
    _t(500, "generic: a GPU model without a row in launcher/smoke/skus.py"),
    _t(10, "generic: a GPU model without a row in launcher/smoke/skus.py"),
    _t(8, "generic: PCIe Gen3 x16 and later"),
    _t(8, "generic: peers over PCIe Gen3 and later"),
    _t(85, "generic: a common maximum operating temperature of datacenter GPUs"),
)

ROWS = (
    H100_SXM,
    H200_SXM,
    H100_PCIE,
    H100_NVL,
    H200_NVL,
    A100_SXM_40,
    A100_SXM_80,
    A100_PCIE_40,
    A100_PCIE_80,
    L40S,
    L4,
    GENERIC,
)

# (pattern on the product name without "NVIDIA ", uppercased; the row, or a (40 GB, 80 GB) pair
# told apart by size). First match wins.
_NAMES = (
    (re.compile(r"H200 NVL\b"), H200_NVL),
    (re.compile(r"H200\b"), H200_SXM),
    (re.compile(r"H100 NVL\b"), H100_NVL),
    (re.compile(r"H100 PCIE\b"), H100_PCIE),
    (re.compile(r"H100\b"), H100_SXM),  # "H100 80GB HBM3", "H100 SXM5 80GB"
    (re.compile(r"A100-SXM4?\b|A100 SXM"), (A100_SXM_40, A100_SXM_80)),
    (re.compile(r"A100\b.*PCIE\b"), (A100_PCIE_40, A100_PCIE_80)),
    (re.compile(r"L40S\b"), L40S),
    (re.compile(r"L4$"), L4),
)


def sku_for(name: str | None, memory_mib: int | float | None = None) -> Sku:
    """The row of one GPU, by its product name (and memory, for A100s that do not say)."""
    if not name:
        return GENERIC
    model = name.upper().strip()
    model = model[len("NVIDIA ") :] if model.startswith("NVIDIA ") else model
    for pattern, row in _NAMES:
        if pattern.match(model):
            if isinstance(row, Sku):
                return row
            if "80GB" in model:
                return row[1]
            if "40GB" in model:
                return row[0]
            return row[1] if memory_mib is not None and memory_mib > 60_000 else row[0]
    return GENERIC


def node_sku(gpus: Iterable) -> Sku:
    """The row this node's GPUs (launcher.smoke.nvidia.GpuInfo) are held to. A node mixing models
    is held to the weakest figure of each, and its row says so."""
    rows: list[Sku] = []
    for gpu in gpus:
        row = sku_for(getattr(gpu, "name", None), getattr(gpu, "memory_mib", None))
        if row not in rows:
            rows.append(row)
    if not rows:
        return GENERIC
    if len(rows) == 1:
        return rows[0]
    weakest: dict = {}
    for item in fields(Sku):
        if item.name == "name":
            continue
        row = min(rows, key=lambda r: getattr(r, item.name).value)
        figure = getattr(row, item.name)
        weakest[item.name] = Threshold(figure.value, f"mixed node, weakest: {row.name}; {figure.source}")
    return replace(rows[0], name="mixed: " + " + ".join(r.name for r in rows), **weakest)
