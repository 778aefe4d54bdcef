"""One preflight result: what was checked, what it found, against which threshold, from where.

A check is pass, warn, fail or skip. ``kind`` says what its failure means: ``node`` (the machine
is bad: retryable elsewhere, exit 138) or ``config`` (the pod asks for what it cannot have:
permanent, exit 2). ``source`` says where the threshold comes from (a flag, a variable, the GPU
model's row in skus.py, the driver), so whoever reads a failure knows what to change.
"""

from __future__ import annotations

from dataclasses import dataclass

PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"


@dataclass(frozen=True)
class Threshold:
    value: float
    source: str


@dataclass
class Check:
    name: str
    status: str
    value: float | int | None = None
    threshold: float | int | None = None
    unit: str = ""
    source: str = ""
    kind: str = "node"
    detail: str = ""  # what a number alone does not say: the bad GPUs, ports, nodes; why a skip
    op: str = "<="  # how value compares to threshold when it passes
    node: str | None = None  # the host it ran on, in a cross-node result

    def as_json(self) -> dict:
        value = round(self.value, 2) if isinstance(self.value, float) else self.value
        found = {
            "name": self.name,
            "status": self.status,
            "value": value,
            "threshold": self.threshold,
            "comparison": self.op if self.threshold is not None else None,
            "unit": self.unit,
            "source": self.source,
            "kind": self.kind,
            "detail": self.detail,
        }
        if self.node is not None:
            found["node"] = self.node
        return found

    def shown_value(self) -> str:
        if self.value is None:
            return "-"
        number = f"{self.value:,.1f}" if isinstance(self.value, float) else str(self.value)
        return f"{number} {self.unit}".strip()

    def shown_threshold(self) -> str:
        if self.threshold is None:
            return ""
        return f"{self.op} {self.threshold:g} {self.unit}".strip()

    def summary(self) -> str:
        """The check in a few words, for the outcome's one-line message."""
        said = self.shown_value() if self.value is not None else ""
        if self.detail and (self.status in (FAIL, WARN) or not said):
            said = f"{said}: {self.detail}" if said else self.detail
        name = f"{self.name} on {self.node}" if self.node else self.name
        return f"{name} ({said})" if said else name


def at_least(
    name: str,
    value: float | None,
    threshold: Threshold,
    unit: str,
    kind: str = "node",
    on_low: str = FAIL,
    unreadable: str = "not measurable here",
) -> Check:
    """A measurement that must reach ``threshold``; SKIP with the reason when there is none."""
    if value is None:
        return Check(name, SKIP, None, threshold.value, unit, threshold.source, kind, unreadable, ">=")
    status = PASS if value >= threshold.value else on_low
    return Check(name, status, float(value), threshold.value, unit, threshold.source, kind, op=">=")


def sum_check(name: str, correct: bool, value: float, unit: str, size: str) -> Check:
    """An all-reduce checked for the right sum; its speed is shown, not judged."""
    said = "correct sum" if correct else "WRONG SUM"
    return Check(name, PASS if correct else FAIL, value, None, unit, detail=f"{said}, {size}")
