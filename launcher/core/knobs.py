"""The launcher's own knobs: one table for the LAUNCHER_* variables and their CLI flags.

Kept free of pydantic so the CLI can parse its flags (and start a framework's agent) before the
validation machinery is imported; launcher.core.settings validates the values.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from launcher.core.failure_policy import DEFAULT_GRACE_PERIOD, DEFAULT_REJOIN_TIMEOUT, TERMINATION_MARGIN


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
        "LAUNCHER_RENDEZVOUS_TIMEOUT",
        "--rendezvous-timeout",
        "how long to wait for the master's DNS name and port before failing retryably (138); default 600s",
    ),
    "grace_period": Knob(
        "LAUNCHER_GRACE_PERIOD",
        "--grace-period",
        "after SIGTERM, how long the ranks have to finish (write a checkpoint) before SIGKILL; default "
        f"{DEFAULT_GRACE_PERIOD:g}s, or the pod's grace less {TERMINATION_MARGIN}s when "
        "--termination-grace-period-seconds is given",
    ),
    "termination_grace_period_seconds": Knob(
        "LAUNCHER_TERMINATION_GRACE_PERIOD_SECONDS",
        "--termination-grace-period-seconds",
        "the pod's terminationGracePeriodSeconds, where a TrainJob raises it: the launcher's grace "
        f"becomes it less {TERMINATION_MARGIN}s, kept to write the termination message; default: unset",
    ),
    "termination_log": Knob(
        "LAUNCHER_TERMINATION_LOG",
        "--termination-log",
        "where to write the JSON termination message; default /dev/termination-log when it exists",
    ),
    "retryable_exit_codes": Knob(
        "LAUNCHER_RETRYABLE_EXIT_CODES",
        "--retryable-exit-codes",
        "exit codes that are retryable; default 130,137,138,143",
    ),
    "retryable_pattern": Knob(
        "LAUNCHER_RETRYABLE_PATTERN",
        "--retryable-pattern",
        "a regex: failures whose output matches it (or the built-in NCCL/ECC/Xid patterns) exit 138",
    ),
    "max_restarts": Knob(
        "LAUNCHER_MAX_RESTARTS",
        "--max-restarts",
        "restart every pod's processes in place, at most this many times, when the job fails "
        "retryably (torchrun's --max-restarts and PET_MAX_RESTARTS mean the same); default 0",
    ),
    "rejoin_timeout": Knob(
        "LAUNCHER_REJOIN_TIMEOUT",
        "--rejoin-timeout",
        "with --max-restarts: after a pod is lost, how long the others hold for Kubernetes to replace it "
        f"and rejoin it before they exit 138 (PeerLost); default {DEFAULT_REJOIN_TIMEOUT:g}s, 0: exit at once",
    ),
    "log_format": Knob("LAUNCHER_LOG_FORMAT", "--log-format", "the launcher's own log lines: text or json"),
    "keep_nproc": Knob(
        "LAUNCHER_KEEP_NPROC",
        "--keep-nproc",
        "1: run PET_NPROC_PER_NODE processes even when fewer accelerators are visible; "
        "default 0: one process per visible accelerator",
    ),
    "allow_untested_versions": Knob(
        "LAUNCHER_ALLOW_UNTESTED_VERSIONS",
        "--allow-untested-versions",
        "1: run a framework's library or a Python outside the supported range (one warning); "
        "default 0: refuse it at start (exit 2)",
    ),
    "hang_timeout": Knob(
        "LAUNCHER_HANG_TIMEOUT",
        "--hang-timeout",
        "end the job as a retryable Hang (138), with every rank's Python stack, when no progress "
        "is seen for this long after the first progress; default 0: off",
    ),
    "hang_startup": Knob(
        "LAUNCHER_HANG_STARTUP",
        "--hang-startup",
        "with --hang-timeout: how long the job may run before its first progress; default 0: no limit",
    ),
    "progress_regex": Knob(
        "LAUNCHER_PROGRESS_REGEX",
        "--progress-regex",
        "a regex for your program's progress lines: named groups step and total, any other named group is a metric",
    ),
    "progress_file": Knob(
        "LAUNCHER_PROGRESS_FILE",
        "--progress-file",
        'a JSON-lines file your program appends progress to ({"step": 10, "total": 100, "loss": 0.3}); '
        "default: a file the launcher names in the ranks' LAUNCHER_PROGRESS_FILE",
    ),
    "status_report": Knob(
        "LAUNCHER_STATUS_REPORT",
        "--status-report",
        "auto: report progress, metrics and the outcome to Trainer's status server when "
        "KUBEFLOW_TRAINER_SERVER_URL is set; off: leave it to the program",
    ),
}


def given(namespace: Any, table: dict[str, Knob], prefix: str = "") -> dict[str, Override]:
    """The knobs of ``table`` set on the command line (argparse ``dest`` = ``prefix + name``)."""
    return {
        name: Override(getattr(namespace, prefix + name), knob.flag)
        for name, knob in table.items()
        if getattr(namespace, prefix + name, None) is not None
    }
