"""Kubernetes failure policies derived from the table of reasons in :mod:`launcher.core.reasons`:
from its retryable set, the one that :func:`~launcher.core.reasons.is_retryable` decides with.

The runtimes under ``runtimes/`` carry these policies as hand-written, commented YAML; a test
proves the YAML equals what this module derives, so ``reasons.py`` stays the one table.

How a failed launcher travels through Kubernetes::

    launcher exit code          Job podFailurePolicy   Job fails with          JobSet failurePolicy
    permanent (1, 2, 139, ...)  FailJob                PodFailurePolicy        FailJobSet
    retryable (130,137,138,143) Count                  BackoffLimitExceeded    RestartJobSet
    pod disrupted (preempted)   Ignore: pod replaced   -                       -

A retryable failure fails the Job once its ``backoffLimit`` is spent: at once for trainers and
mpirun's pods (0: one lost rank of a static rendezvous needs the whole group restarted, which is
what a JobSet restart does), after a few pod retries for initializers (their downloads resume
where they stopped, and nothing else runs while they do). ``maxRestarts`` bounds the JobSet
restarts; every restart re-runs every Job, initializers included (they find their files done).

The pod's ``terminationGracePeriodSeconds`` is derived from the launcher's grace period (what
its ranks get after SIGTERM to write a checkpoint) plus :data:`TERMINATION_MARGIN`, the time the
launcher needs after the grace to write its termination message; :func:`grace_period_for` is the
inverse, for a pod whose grace a TrainJob raised (``LAUNCHER_TERMINATION_GRACE_PERIOD_SECONDS``).

Pure: dicts in the shapes of the Kubernetes and JobSet APIs, no I/O.
"""

from __future__ import annotations

import math

from launcher.core.reasons import DEFAULT_RETRYABLE_EXIT_CODES, SUCCESS

# podFailurePolicy works only with pods that are never restarted in place.
RESTART_POLICY = "Never"
# Set by Kubernetes on pods that are preempted, evicted or deleted by the taint manager.
DISRUPTION_CONDITION = "DisruptionTarget"
# The reasons a failed Job reports (its Failed condition), which JobSet rules match on.
REASON_POD_FAILURE_POLICY = "PodFailurePolicy"
REASON_BACKOFF_LIMIT = "BackoffLimitExceeded"

# The launcher's grace period by default (LAUNCHER_GRACE_PERIOD): after SIGTERM, how long its
# ranks have to finish (write a checkpoint) before SIGKILL.
DEFAULT_GRACE_PERIOD = 25.0
# What the pod's grace holds beyond the launcher's: after the grace, the launcher kills what is
# left, judges the job and writes its termination message before the kubelet's SIGKILL.
TERMINATION_MARGIN = 5

TRAINER_BACKOFF_LIMIT = 0
INITIALIZER_BACKOFF_LIMIT = 3
MAX_RESTARTS = 3

# Replicated job -> the container whose exit code decides (Trainer's names).
INITIALIZER_JOBS = ("dataset-initializer", "model-initializer")
TRAINER_CONTAINER = "node"

# Kubernetes limits for onExitCodes.values.
_MAX_VALUES = 255


def container_for(replicated_job: str) -> str:
    """The container a replicated job's policy names: initializers are named like their job,
    every other job (``node``, ``launcher``) runs its work in the ``node`` container."""
    return replicated_job if replicated_job in INITIALIZER_JOBS else TRAINER_CONTAINER


def backoff_limit_for(replicated_job: str) -> int:
    return INITIALIZER_BACKOFF_LIMIT if replicated_job in INITIALIZER_JOBS else TRAINER_BACKOFF_LIMIT


def termination_grace_period_seconds(grace_period: float = DEFAULT_GRACE_PERIOD) -> int:
    """The pod's ``terminationGracePeriodSeconds`` for a launcher whose grace is ``grace_period``
    seconds: the whole grace, then the launcher's margin to write its termination message."""
    return math.ceil(grace_period) + TERMINATION_MARGIN


def grace_period_for(termination_grace_period: int) -> float:
    """The launcher's grace in a pod whose ``terminationGracePeriodSeconds`` is this: the
    inverse of :func:`termination_grace_period_seconds` (a pod's grace must exceed the margin)."""
    if termination_grace_period <= TERMINATION_MARGIN:
        raise ValueError(f"a pod's grace of {termination_grace_period}s leaves its ranks none")
    return float(termination_grace_period - TERMINATION_MARGIN)


def tolerated_exit_codes(retryable_codes: frozenset[int] = DEFAULT_RETRYABLE_EXIT_CODES) -> list[int]:
    """Exit codes that must NOT fail the Job at once: success and the retryable set, sorted
    ascending without duplicates as Kubernetes requires."""
    values = sorted({SUCCESS, *retryable_codes})
    if values[0] < 0 or values[-1] > 255:
        raise ValueError(f"exit codes must lie in 0..255: {values}")
    if len(values) > _MAX_VALUES:
        raise ValueError(f"at most {_MAX_VALUES} exit codes fit in onExitCodes.values")
    return values


def pod_failure_policy(container: str, retryable_codes: frozenset[int] = DEFAULT_RETRYABLE_EXIT_CODES) -> dict:
    """Rules are evaluated in order and the first match wins: a disrupted pod is replaced
    without counting; any exit code outside the tolerated set fails the Job at once; what is
    left (a retryable code, or a pod that failed without an exit code) counts against the
    Job's backoffLimit, the default action."""
    return {
        "rules": [
            {"action": "Ignore", "onPodConditions": [{"type": DISRUPTION_CONDITION, "status": "True"}]},
            {
                "action": "FailJob",
                "onExitCodes": {
                    "containerName": container,
                    "operator": "NotIn",
                    "values": tolerated_exit_codes(retryable_codes),
                },
            },
        ]
    }


def job_policy(
    replicated_job: str,
    retryable_codes: frozenset[int] = DEFAULT_RETRYABLE_EXIT_CODES,
    grace_period: float = DEFAULT_GRACE_PERIOD,
) -> dict:
    """The failure-handling fields of a replicated job's Job spec (``template.spec``), and the
    pod's grace that lets a launcher with ``grace_period`` write its termination message."""
    return {
        "backoffLimit": backoff_limit_for(replicated_job),
        "podFailurePolicy": pod_failure_policy(container_for(replicated_job), retryable_codes),
        "template": {
            "spec": {
                "restartPolicy": RESTART_POLICY,
                "terminationGracePeriodSeconds": termination_grace_period_seconds(grace_period),
            }
        },
    }


def jobset_failure_policy(max_restarts: int = MAX_RESTARTS) -> dict:
    """JobSet rules, first match wins. Rule names allow letters, digits, ``_,:`` only."""
    return {
        "maxRestarts": max_restarts,
        "rules": [
            {"name": "PermanentExitCode", "action": "FailJobSet", "onJobFailureReasons": [REASON_POD_FAILURE_POLICY]},
            {"name": "RetryableFailure", "action": "RestartJobSet", "onJobFailureReasons": [REASON_BACKOFF_LIMIT]},
        ],
    }


def policy(
    replicated_job: str = "node",
    retryable_codes: frozenset[int] = DEFAULT_RETRYABLE_EXIT_CODES,
    max_restarts: int = MAX_RESTARTS,
    grace_period: float = DEFAULT_GRACE_PERIOD,
) -> dict:
    """Everything a runtime needs for one replicated job, as ``trainer-launcher policy`` prints it."""
    return {
        "replicatedJob": replicated_job,
        "retryableExitCodes": sorted(retryable_codes),
        "job": job_policy(replicated_job, retryable_codes, grace_period),
        "jobSet": {"failurePolicy": jobset_failure_policy(max_restarts)},
    }
