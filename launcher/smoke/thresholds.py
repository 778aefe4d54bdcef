"""Which threshold each check is held to, and where it comes from: a flag or a LAUNCHER_SMOKE_*
variable when one is given, else the GPU model's row (launcher.smoke.skus)."""

from __future__ import annotations

from launcher.core import settings
from launcher.core.settings import Override
from launcher.smoke.result import Threshold
from launcher.smoke.settings import SmokeSettings
from launcher.smoke.skus import FLOOR_FIELDS, GENERIC, Sku

# The rows' all-reduce floors are for the node's 8 GPUs; fewer GPUs share fewer links.
BUSBW_GPUS = 8


def _given(smoke: SmokeSettings, field: str, overrides: dict[str, Override] | None) -> Threshold | None:
    return plain(smoke, field, overrides) if getattr(smoke, field) is not None else None


def gpu_floors(
    smoke: SmokeSettings, sku: Sku, gpus: int, overrides: dict[str, Override] | None = None
) -> dict[str, Threshold]:
    """{bf16_tflops, copy_gbps, busbw_gbps, h2d_gbps, p2p_gbps: Threshold}."""
    floors = {}
    for field in FLOOR_FIELDS:
        floor = _given(smoke, "min_" + field, overrides) or getattr(sku, field)
        if field == "busbw_gbps" and floor is getattr(sku, field) and gpus != BUSBW_GPUS:
            floor = Threshold(
                GENERIC.busbw_gbps.value,
                f"the {sku.name} floor is for {BUSBW_GPUS} GPUs, this node has {gpus}: generic floor",
            )
        floors[field] = floor
    return floors


def max_temp(smoke: SmokeSettings, overrides: dict[str, Override] | None = None) -> Threshold | None:
    """A limit that replaces every GPU's own maximum operating temperature, when given."""
    return _given(smoke, "max_gpu_temp_c", overrides)


def plain(smoke: SmokeSettings, field: str, overrides: dict[str, Override] | None = None) -> Threshold:
    """A threshold with a plain default (the pod's, the CPU's, the cross-node ones)."""
    return Threshold(getattr(smoke, field), settings.source_of(SmokeSettings, field, overrides) or "default")
