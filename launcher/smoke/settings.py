"""The preflight's settings: its level and thresholds (each also a flag)."""

from __future__ import annotations

import functools
from typing import Annotated, Any

from pydantic_settings import NoDecode

from launcher.core.settings import Invalid, Settings, knob_field, parse_duration, parsed
from launcher.smoke.knobs import SMOKE_KNOBS

_smoke_knob = functools.partial(knob_field, SMOKE_KNOBS)
LEVELS = ("quick", "long")


def parse_positive(raw: Any) -> float:
    try:
        value = float(str(raw).strip())
    except ValueError:
        raise Invalid("a number >= 0") from None
    if not 0 <= value < 1e9:
        raise Invalid("a number >= 0")
    return value


def parse_ratio(raw: Any) -> float:
    try:
        value = float(str(raw).strip())
    except ValueError:
        raise Invalid("a number between 0 and 1") from None
    if not 0 < value <= 1:
        raise Invalid("a number between 0 and 1")
    return value


def parse_level(raw: Any) -> str:
    value = str(raw).strip().lower()
    if value not in LEVELS:
        raise Invalid(" or ".join(LEVELS))
    return value


Positive = Annotated[float, NoDecode, parsed(parse_positive)]
# None: the GPU model's floor (launcher.smoke.skus), or the GPU's own limit.
ByModel = Annotated[float | None, NoDecode, parsed(parse_positive)]


class SmokeSettings(Settings):
    """Level and thresholds of the preflight (each also a flag)."""

    level: Annotated[str, NoDecode, parsed(parse_level)] = _smoke_knob("level", "quick")
    min_shm_gb: Positive = _smoke_knob("min_shm_gb", 1.0)
    min_free_gb: Positive = _smoke_knob("min_free_gb", 10.0)
    min_matmul_gflops: Positive = _smoke_knob("min_matmul_gflops", 1.0)
    min_bf16_tflops: ByModel = _smoke_knob("min_bf16_tflops", None)
    min_copy_gbps: ByModel = _smoke_knob("min_copy_gbps", None)
    min_busbw_gbps: ByModel = _smoke_knob("min_busbw_gbps", None)
    min_h2d_gbps: ByModel = _smoke_knob("min_h2d_gbps", None)
    min_p2p_gbps: ByModel = _smoke_knob("min_p2p_gbps", None)
    max_gpu_temp_c: ByModel = _smoke_knob("max_gpu_temp_c", None)
    xid_window: Annotated[float, NoDecode, parsed(parse_duration)] = _smoke_knob("xid_window", 86400.0)
    min_node_gbps: Positive = _smoke_knob("min_node_gbps", 1.0)
    slow_node_ratio: Annotated[float, NoDecode, parsed(parse_ratio)] = _smoke_knob("slow_node_ratio", 0.5)
