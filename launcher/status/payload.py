"""The body of a status update, kept within upstream's rules so the server never refuses it.

Upstream kubeflow/trainer v2.3.0: ``TrainerStatus`` in pkg/apis/trainer/v1alpha1/trainjob_types.go
(progressPercentage int32 0..100, estimatedRemainingSeconds int32 >= 0, at most 256 metrics whose
name and value are 1..64 characters, lastUpdatedTime required) and pkg/statusserver (a body over
64 KiB is refused). A value that breaks a rule is clamped, shortened or dropped here, never sent.
"""

from __future__ import annotations

import datetime
import json
import math
from typing import Any

MAX_BODY = 64 * 1024
MAX_METRICS = 256
MAX_LEN = 64
_INT32_MAX = 2**31 - 1  # both numbers are int32 upstream: a larger one fails to decode (422)


def encode(body: dict) -> bytes:
    """The bytes that are sent (and measured against MAX_BODY)."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


def _whole(value: Any, high: int) -> int | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    if math.isnan(number):
        return None
    return int(max(0, min(high, math.floor(number) if math.isfinite(number) else number)))


def _value_text(value: str) -> str | None:
    if len(value) <= MAX_LEN:
        return value or None
    try:
        # A long float keeps its meaning in fewer digits; a plain cut keeps a prefix Katib can parse.
        number = float(value)
        shorter = repr(number)
        if len(shorter) <= MAX_LEN and math.isfinite(number):
            return shorter
    except ValueError:
        pass
    return value[:MAX_LEN]


def _metrics(metrics: list[tuple[str, str]]) -> list[dict[str, str]]:
    """Valid metrics, first-seen order; a repeated name keeps its place and takes the later value."""
    kept: dict[str, str] = {}
    for name, value in metrics:
        name, text = str(name), _value_text(str(value))
        if not name or len(name) > MAX_LEN or text is None:
            continue  # a shortened name could collide with another one: drop it instead
        if name in kept or len(kept) < MAX_METRICS:
            kept[name] = text
    return [{"name": name, "value": value} for name, value in kept.items()]


def timestamp(now: datetime.datetime) -> str:
    """RFC 3339 in UTC with a Z, to the second (metav1.Time's own precision)."""
    if now.tzinfo is None:
        now = now.replace(tzinfo=datetime.UTC)
    return now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def trainer_status(
    *, percent: int | float | None, eta: int | float | None, metrics: list[tuple[str, str]], now: datetime.datetime
) -> dict:
    """``{"trainerStatus": {...}}`` obeying upstream's rules. Metrics are kept in the order given:
    when the body would pass MAX_BODY, the last ones are dropped, so put the important ones first."""
    status: dict[str, Any] = {}
    if percent is not None and (value := _whole(percent, 100)) is not None:
        status["progressPercentage"] = value
    if eta is not None and (value := _whole(eta, _INT32_MAX)) is not None:
        status["estimatedRemainingSeconds"] = value
    items = _metrics(metrics)
    status["lastUpdatedTime"] = timestamp(now)
    body = {"trainerStatus": status}
    size = len(encode(body))
    if items:
        size += len(',"metrics":[]')
        for index, item in enumerate(items):
            size += len(encode(item)) + (1 if index else 0)
            if size > MAX_BODY:
                items = items[:index]
                break
        if items:
            status["metrics"] = items
    return body
