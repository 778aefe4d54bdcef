"""The smoke test's thresholds."""

from __future__ import annotations

import functools
from typing import Annotated, Any

from pydantic_settings import NoDecode

from launcher.core.settings import Invalid, Settings, knob_field, parsed
from launcher.smoke.knobs import SMOKE_KNOBS

_smoke_knob = functools.partial(knob_field, SMOKE_KNOBS)


def parse_positive(raw: Any) -> float:
    try:
        value = float(str(raw).strip())
    except ValueError:
        raise Invalid("a number >= 0") from None
    if not 0 <= value < 1e9:
        raise Invalid("a number >= 0")
    return value



class SmokeSettings(Settings):
    """Thresholds of the preflight (each also a flag)."""

    min_shm_gb: Annotated[float, NoDecode, parsed(parse_positive)] = _smoke_knob("min_shm_gb", 1.0)
    min_free_gb: Annotated[float, NoDecode, parsed(parse_positive)] = _smoke_knob("min_free_gb", 10.0)
    min_matmul_gflops: Annotated[float, NoDecode, parsed(parse_positive)] = _smoke_knob("min_matmul_gflops", 1.0)
    min_bf16_tflops: Annotated[float, NoDecode, parsed(parse_positive)] = _smoke_knob("min_bf16_tflops", 100.0)
    min_copy_gbps: Annotated[float, NoDecode, parsed(parse_positive)] = _smoke_knob("min_copy_gbps", 500.0)
    min_busbw_gbps: Annotated[float, NoDecode, parsed(parse_positive)] = _smoke_knob("min_busbw_gbps", 10.0)
