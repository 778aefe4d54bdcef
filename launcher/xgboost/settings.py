"""What Trainer's XGBoost policy injects into the ``node`` container, validated.

Upstream (pkg/runtime/framework/plugins/xgboost, v2.3.0) sets ``DMLC_TRACKER_URI`` to
``<trainjob>-node-0-0.<trainjob>``, ``DMLC_TRACKER_PORT`` to 29500, ``DMLC_TASK_ID`` to the pod's
Job completion index and ``DMLC_NUM_WORKER`` to numNodes x (GPUs per node, or 1).
"""

from __future__ import annotations

import functools
from typing import Annotated, Any

from pydantic_settings import NoDecode

from launcher.core import settings
from launcher.core.knobs import Override
from launcher.core.settings import Invalid, Settings, field, int_in, knob_field, parse_choice, parse_host, parsed
from launcher.xgboost.knobs import XGBOOST_KNOBS

MAX_WORKERS = 100_000
MAX_WORKERS_PER_POD = 1024

_xgboost_knob = functools.partial(knob_field, XGBOOST_KNOBS)


def parse_workers_per_pod(raw: Any) -> str | int:
    text = str(raw).strip().lower()
    if text == "auto":
        return text
    try:
        return int_in(1, MAX_WORKERS_PER_POD)(text)
    except Invalid:
        raise Invalid(f"auto or a worker count from 1 to {MAX_WORKERS_PER_POD}") from None


def parse_tracker_host(raw: Any) -> str:
    """The tracker's DNS name or IP address; xgboost takes it bare, so no port and no brackets."""
    text = str(raw).strip()
    expected = "the tracker's DNS name or IP address, without a port (Trainer sets <trainjob>-node-0-0.<trainjob>)"
    if text.startswith("["):
        raise Invalid(expected)
    try:
        return parse_host(text)
    except Invalid:
        raise Invalid(expected) from None


class XGBoostSettings(Settings):
    """Trainer's DMLC_* variables and the XGBoost role's own knobs."""

    tracker_uri: Annotated[str | None, NoDecode, parsed(parse_tracker_host)] = field(
        "DMLC_TRACKER_URI", None, "the pod that runs the RabitTracker (pod 0)"
    )
    tracker_port: Annotated[int, NoDecode, parsed(int_in(1, 65535, "a port"))] = field(
        "DMLC_TRACKER_PORT", 29500, "the tracker's port"
    )
    task_id: Annotated[int, NoDecode, parsed(int_in(0, MAX_WORKERS - 1, "a pod index"))] = field(
        ("DMLC_TASK_ID", "JOB_COMPLETION_INDEX"), 0, "this pod's index (Trainer: the Job completion index)"
    )
    num_worker: Annotated[int, NoDecode, parsed(int_in(1, MAX_WORKERS, "a worker count"))] = field(
        "DMLC_NUM_WORKER", 1, "XGBoost workers in the job: numNodes x (GPUs per node, or 1)"
    )
    tracker: Annotated[str, NoDecode, parsed(parse_choice("auto", "launcher", "program"))] = _xgboost_knob(
        "tracker", "auto"
    )
    workers_per_pod: Annotated[str | int, NoDecode, parsed(parse_workers_per_pod)] = _xgboost_knob(
        "workers_per_pod", "auto"
    )


def load_xgboost(overrides: dict[str, Override] | None = None) -> XGBoostSettings:
    """XGBoostSettings, with the checks that span two variables, each still one ConfigError line."""
    expected = "the tracker's DNS name {when} (Trainer sets <trainjob>-node-0-0.<trainjob>)"
    return settings.load_member(
        XGBoostSettings, overrides, ("task_id", "num_worker", "a pod index"), ("tracker_uri", expected)
    )
