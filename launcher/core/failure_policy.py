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

With JobSet's in-place restart (``in_place=True``, the in-place runtime under ``runtimes/``) a
retryable code restarts the trainer's container where it runs (its ``restartPolicyRules``), the
pod does not fail, and the other pods restart theirs when the JobSet asks them to
(:mod:`launcher.k8s.inplace`); a permanent code still fails the pod, podFailurePolicy still fails
the Job and the JobSet. JobSet v0.12's webhook demands ``backoffLimit`` MaxInt32 and
``podReplacementPolicy: Failed`` there: a pod lost with its node is replaced, and its newcomer
joins at the next attempt.

Pure: dicts in the shapes of the Kubernetes and JobSet APIs, no I/O.
"""

from __future__ import annotations

from launcher.core.reasons import DEFAULT_RETRYABLE_EXIT_CODES, SUCCESS

# podFailurePolicy works only with pods that are never restarted in place.
RESTART_POLICY = "Never"
# Set by Kubernetes on pods that are preempted, evicted or deleted by the taint manager.
DISRUPTION_CONDITION = "DisruptionTarget"
# The reasons a failed Job reports (its Failed condition), which JobSet rules match on.
REASON_POD_FAILURE_POLICY = "PodFailurePolicy"
REASON_BACKOFF_LIMIT = "BackoffLimitExceeded"

TRAINER_BACKOFF_LIMIT = 0
INITIALIZER_BACKOFF_LIMIT = 3
MAX_RESTARTS = 3
# JobSet's in-place restart: what its webhook demands of every replicated job, and the strategy.
IN_PLACE_BACKOFF_LIMIT = 2**31 - 1
IN_PLACE_POD_REPLACEMENT = "Failed"
IN_PLACE_RESTART_STRATEGY = "InPlaceRestart"

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
    replicated_job: str, retryable_codes: frozenset[int] = DEFAULT_RETRYABLE_EXIT_CODES, in_place: bool = False
) -> dict:
    """The failure-handling fields of a replicated job's Job spec (``template.spec``)."""
    policy: dict = {"backoffLimit": IN_PLACE_BACKOFF_LIMIT if in_place else backoff_limit_for(replicated_job)}
    if in_place:
        policy["podReplacementPolicy"] = IN_PLACE_POD_REPLACEMENT
    policy["podFailurePolicy"] = pod_failure_policy(container_for(replicated_job), retryable_codes)
    policy["template"] = {"spec": {"restartPolicy": RESTART_POLICY}}
    return policy


def container_restart_rules(retryable_codes: frozenset[int] = DEFAULT_RETRYABLE_EXIT_CODES) -> dict:
    """The trainer container's own restart policy under in-place restart (Kubernetes 1.34+,
    container restart rules): a retryable code restarts it where it runs, any other ends it and
    the pod fails. The in-place restart agent's exit code must be one of these."""
    return {
        "restartPolicy": RESTART_POLICY,
        "restartPolicyRules": [
            {"action": "Restart", "exitCodes": {"operator": "In", "values": sorted(retryable_codes)}},
        ],
    }


def jobset_failure_policy(max_restarts: int = MAX_RESTARTS, in_place: bool = False) -> dict:
    """JobSet rules, first match wins. Rule names allow letters, digits, ``_,:`` only. In place,
    ``maxRestarts`` bounds the in-place attempts too (JobSet fails the JobSet past it)."""
    policy: dict = {"maxRestarts": max_restarts}
    if in_place:
        policy["restartStrategy"] = IN_PLACE_RESTART_STRATEGY
    policy["rules"] = [
        {"name": "PermanentExitCode", "action": "FailJobSet", "onJobFailureReasons": [REASON_POD_FAILURE_POLICY]},
        {"name": "RetryableFailure", "action": "RestartJobSet", "onJobFailureReasons": [REASON_BACKOFF_LIMIT]},
    ]
    return policy


def policy(
    replicated_job: str = "node",
    retryable_codes: frozenset[int] = DEFAULT_RETRYABLE_EXIT_CODES,
    max_restarts: int = MAX_RESTARTS,
) -> dict:
    """Everything a runtime needs for one replicated job, as ``trainer-launcher policy`` prints it."""
    return {
        "replicatedJob": replicated_job,
        "retryableExitCodes": sorted(retryable_codes),
        "job": job_policy(replicated_job, retryable_codes),
        "jobSet": {"failurePolicy": jobset_failure_policy(max_restarts)},
    }
