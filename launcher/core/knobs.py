"""The launcher's own knobs: one table for the LAUNCHER_* variables and their CLI flags.

Kept free of pydantic so the CLI can parse its flags (and start the torch agent) before the
validation machinery is imported; launcher.core.settings validates the values.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class Override(NamedTuple):
    """A value given on the command line, which wins over the environment."""

    value: Any
    source: str  # the flag as the user typed it, e.g. "--grace-period" or "--nnodes"


class Knob(NamedTuple):
    env: str
    flag: str
    help: str


KNOBS: dict[str, Knob] = {
    "rendezvous_timeout": Knob(
        "LAUNCHER_RENDEZVOUS_TIMEOUT", "--rendezvous-timeout",
        "how long to wait for the master's DNS name and port before failing retryably (138); default 600s"),
    "grace_period": Knob(
        "LAUNCHER_GRACE_PERIOD", "--grace-period",
        "on teardown, SIGTERM-to-SIGKILL grace; keep it below terminationGracePeriodSeconds; default 25s"),
    "termination_log": Knob(
        "LAUNCHER_TERMINATION_LOG", "--termination-log",
        "where to write the JSON termination message; default /dev/termination-log when it exists"),
    "retryable_exit_codes": Knob(
        "LAUNCHER_RETRYABLE_EXIT_CODES", "--retryable-exit-codes",
        "exit codes that are retryable; default 130,137,138,143"),
    "retryable_pattern": Knob(
        "LAUNCHER_RETRYABLE_PATTERN", "--retryable-pattern",
        "a regex: failures whose output matches it (or the built-in NCCL/ECC/Xid patterns) exit 138"),
    "log_format": Knob("LAUNCHER_LOG_FORMAT", "--log-format", "the launcher's own log lines: text or json"),
    "keep_nproc": Knob(
        "LAUNCHER_KEEP_NPROC", "--keep-nproc",
        "1: run PET_NPROC_PER_NODE processes even when fewer accelerators are visible; "
        "default 0: one process per visible accelerator"),
}


def given(namespace: Any, table: dict[str, Knob], prefix: str = "") -> dict[str, Override]:
    """The knobs of ``table`` set on the command line (argparse ``dest`` = ``prefix + name``)."""
    return {
        name: Override(getattr(namespace, prefix + name), knob.flag)
        for name, knob in table.items()
        if getattr(namespace, prefix + name, None) is not None
    }
