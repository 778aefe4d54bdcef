"""Kubernetes failure policies derived from the table of reasons in :mod:`launcher.core.reasons`:
from its retryable set, the one that :func:`~launcher.core.reasons.is_retryable` decides with.

The runtimes under ``runtimes/`` carry these policies as hand-written, commented YAML; a test
proves the YAML equals what this module derives, so ``reasons.py`` stays the one table.

Who retries what, for each way a launcher ends (:func:`who_retries` makes the full rows;
docs/failure-policy.md shows them, and tests prove both agree with it)::

    launcher exit                   launcher (in its pod)           Job                           JobSet
    0                               done                            -                             -
    permanent (1, 2, 70, 126, ...)  exits at once                   FailJob: PodFailurePolicy     FailJobSet
    retryable (130,137,138,143)     restarts its ranks in place     Count: BackoffLimitExceeded   RestartJobSet, at
                                    while LAUNCHER_MAX_RESTARTS     once backoffLimit is spent    most maxRestarts
                                    lasts, then exits
    pod disrupted (preempted)       SIGTERM: the ranks' grace, 143  Ignore: pod replaced          -
    another pod lost (PeerLost)     holds for its replacement,      the lost pod: Ignore: or      -
                                    which rejoins; 138 after        Count: replaced once
                                    LAUNCHER_REJOIN_TIMEOUT

A retryable failure fails the Job once its ``backoffLimit`` is spent. Trainers' is 1 (mpirun's own pod's 0):
one pod lost without a disruption (its container killed whole) is replaced inside its Job, and
the replacement rejoins the others where they restart in place (launcher.core.lobby); when the
launcher gives up, every pod of a multi-node job exits at once and spends it, so the Job fails and
the JobSet restarts everything. Initializers' is a few pod retries (their downloads resume where
they stopped, and nothing else runs while they do). ``maxRestarts`` bounds the JobSet
restarts; every restart re-runs every Job, initializers included (they find their files done).

The pod's ``terminationGracePeriodSeconds`` is derived from the launcher's grace period (what
its ranks get after SIGTERM to write a checkpoint) plus :data:`TERMINATION_MARGIN`, the time the
launcher needs after the grace to write its termination message; :func:`grace_period_for` is the
inverse, for a pod whose grace a TrainJob raised (``LAUNCHER_TERMINATION_GRACE_PERIOD_SECONDS``).

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

import math
import signal
from typing import NamedTuple

from launcher.core.reasons import DEFAULT_RETRYABLE_EXIT_CODES, SUCCESS, Reasons, is_retryable

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
# The launcher's in-place restarts (launcher/core/knobs.py, max_restarts), as users set them.
MAX_RESTARTS_VARIABLE = "LAUNCHER_MAX_RESTARTS"

# One pod replaced inside its Job, which rejoins the others; the launcher giving up on every pod
# of a multi-node job at once spends it.
TRAINER_BACKOFF_LIMIT = 1
# How long the pods that remain hold for a lost pod's replacement by default (LAUNCHER_REJOIN_TIMEOUT).
DEFAULT_REJOIN_TIMEOUT = 300.0
INITIALIZER_BACKOFF_LIMIT = 3
# mpirun's own pod: mpirun cannot go on without a host, and starts again in place or with the JobSet.
MPI_LAUNCHER_BACKOFF_LIMIT = 0
MAX_RESTARTS = 3
# JobSet's in-place restart: what its webhook demands of every replicated job, and the strategy.
IN_PLACE_BACKOFF_LIMIT = 2**31 - 1
IN_PLACE_POD_REPLACEMENT = "Failed"
IN_PLACE_RESTART_STRATEGY = "InPlaceRestart"

# Replicated job -> the container whose exit code decides (Trainer's names).
INITIALIZER_JOBS = ("dataset-initializer", "model-initializer")
TRAINER_CONTAINER = "node"
MPI_LAUNCHER_JOB = "launcher"

# Kubernetes limits for onExitCodes.values.
_MAX_VALUES = 255


def container_for(replicated_job: str) -> str:
    """The container a replicated job's policy names: initializers are named like their job,
    every other job (``node``, ``launcher``) runs its work in the ``node`` container."""
    return replicated_job if replicated_job in INITIALIZER_JOBS else TRAINER_CONTAINER


def backoff_limit_for(replicated_job: str) -> int:
    if replicated_job in INITIALIZER_JOBS:
        return INITIALIZER_BACKOFF_LIMIT
    return MPI_LAUNCHER_BACKOFF_LIMIT if replicated_job == MPI_LAUNCHER_JOB else TRAINER_BACKOFF_LIMIT


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
    in_place: bool = False,
) -> dict:
    """The failure-handling fields of a replicated job's Job spec (``template.spec``), and the
    pod's grace that lets a launcher with ``grace_period`` write its termination message."""
    policy: dict = {"backoffLimit": IN_PLACE_BACKOFF_LIMIT if in_place else backoff_limit_for(replicated_job)}
    if in_place:
        policy["podReplacementPolicy"] = IN_PLACE_POD_REPLACEMENT
    policy["podFailurePolicy"] = pod_failure_policy(container_for(replicated_job), retryable_codes)
    policy["template"] = {
        "spec": {
            "restartPolicy": RESTART_POLICY,
            "terminationGracePeriodSeconds": termination_grace_period_seconds(grace_period),
        }
    }
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
    grace_period: float = DEFAULT_GRACE_PERIOD,
) -> dict:
    """Everything a runtime needs for one replicated job, as ``trainer-launcher policy`` prints it."""
    return {
        "replicatedJob": replicated_job,
        "retryableExitCodes": sorted(retryable_codes),
        "job": job_policy(replicated_job, retryable_codes, grace_period),
        "jobSet": {"failurePolicy": jobset_failure_policy(max_restarts)},
    }


# --- who retries what ----------------------------------------------------------------------------


def job_action(exit_code: int, disrupted: bool = False, rules: list[dict] | None = None) -> str:
    """What a Job does with a failed pod of ours under ``rules`` (default: :func:`pod_failure_policy`'s
    for the trainer): the first rule that matches, else Kubernetes' default, ``Count``. Only the
    shapes this module makes are read (one container, onExitCodes with In or NotIn)."""
    for rule in rules if rules is not None else pod_failure_policy(TRAINER_CONTAINER)["rules"]:
        if "onPodConditions" in rule:
            matched = disrupted and any(c["type"] == DISRUPTION_CONDITION for c in rule["onPodConditions"])
        else:
            on_codes = rule["onExitCodes"]
            matched = exit_code != SUCCESS and (exit_code in on_codes["values"]) == (on_codes["operator"] == "In")
        if matched:
            return rule["action"]
    return "Count"


# The reason a Job fails with, by the podFailurePolicy action that failed it.
_JOB_FAILURE_REASON = {"FailJob": REASON_POD_FAILURE_POLICY, "Count": REASON_BACKOFF_LIMIT}


def jobset_rule(job_failure_reason: str, max_restarts: int = MAX_RESTARTS) -> dict:
    """The JobSet rule that a Job failed for this reason meets: the first that names it."""
    rules = jobset_failure_policy(max_restarts)["rules"]
    return next(rule for rule in rules if job_failure_reason in rule["onJobFailureReasons"])


class Retry(NamedTuple):
    """One row of :func:`who_retries`: a way the launcher's pod ends, and what each level does."""

    ending: str  # the launcher's exit, or what happened to its pod
    launcher: str  # the launcher, in the pod: LAUNCHER_MAX_RESTARTS
    job: str  # the Job: podFailurePolicy, backoffLimit
    jobset: str  # the JobSet: failurePolicy, maxRestarts


def who_retries(
    retryable_codes: frozenset[int] = DEFAULT_RETRYABLE_EXIT_CODES,
    max_restarts: int = MAX_RESTARTS,
    grace_period: float = DEFAULT_GRACE_PERIOD,
) -> list[Retry]:
    """Who retries what, one row per way a pod ends: each level's answer is this module's
    policy (and :func:`~launcher.core.reasons.is_retryable`) applied to a code of that class."""
    tolerated = tolerated_exit_codes(retryable_codes)
    permanent = [code for code in range(1, 256) if code not in tolerated]
    retryable = sorted(retryable_codes)
    # Permanent codes users meet: a program's 1, the table's own codes, a segfault.
    own = {reason.code for reason in Reasons.all() if reason.code is not None}
    examples = sorted(code for code in {1, *own, 128 + signal.SIGSEGV} if code in permanent)
    rules = pod_failure_policy(TRAINER_CONTAINER, retryable_codes)["rules"]

    def job(code: int, disrupted: bool = False) -> str:
        action = job_action(code, disrupted, rules)
        if action == "Ignore":
            return "`Ignore`: the pod is replaced, nothing counted"
        reason = _JOB_FAILURE_REASON[action]
        if action == "FailJob":
            return f"`FailJob`: the Job fails at once (`{reason}`), no pod is replaced"
        trainers, initializers = TRAINER_BACKOFF_LIMIT, INITIALIZER_BACKOFF_LIMIT
        return (
            f"`Count`: the Job fails (`{reason}`) once `backoffLimit` is spent: trainers' is {trainers} (one "
            "pod replaced, which rejoins the others; every pod of a multi-node job ending at once spends it), "
            f"initializers' {initializers} (a new pod each time, their downloads resume)"
        )

    def jobset(code: int) -> str:
        rule = jobset_rule(_JOB_FAILURE_REASON[job_action(code, rules=rules)], max_restarts)
        if rule["action"] == "FailJobSet":
            return f"`FailJobSet` (`{rule['name']}`): the TrainJob fails"
        return (
            f"`{rule['action']}` (`{rule['name']}`): every Job is made again, initializers included, "
            f"at most `maxRestarts` ({max_restarts}) times; then the TrainJob fails"
        )

    def launcher(code: int) -> str:
        if is_retryable(code, retryable_codes):
            return (
                f"in a trainer's pod, stops the ranks and starts them again there (a new generation) "
                f"while `{MAX_RESTARTS_VARIABLE}` (default 0) has restarts left; then exits with the code"
            )
        return "exits at once with the code, restarts left or not"

    grace, terminated = f"{grace_period:g}", 128 + signal.SIGTERM
    return [
        Retry("0: succeeded", "done", "-", "-"),
        Retry(
            f"permanent: every code but {', '.join(map(str, tolerated))} ({', '.join(map(str, examples))}, ...)",
            launcher(permanent[0]),
            job(permanent[0]),
            jobset(permanent[0]),
        ),
        Retry(
            f"retryable: {', '.join(map(str, retryable))}",
            launcher(retryable[0]),
            job(retryable[0]),
            jobset(retryable[0]),
        ),
        Retry(
            f"pod disrupted (`{DISRUPTION_CONDITION}`: preempted, evicted, drained), whatever its code",
            f"SIGTERM: the ranks get the grace ({grace} s) to write a checkpoint (then {terminated}, "
            "`Terminated`, if they were stopped); no restart in place, the pod is going away",
            job(permanent[0], disrupted=True),
            "- (the replacement rejoins the others: next row)",
        ),
        Retry(
            "another pod lost (its node gone, its container killed whole, the pod deleted): "
            "this pod's ranks end `PeerLost`, 138",
            f"while restarts are left, stops its ranks and holds for the lost pod's replacement "
            f"(`LAUNCHER_REJOIN_TIMEOUT`, default {DEFAULT_REJOIN_TIMEOUT:g} s), which finds the generation "
            "it holds for and joins it (where the framework has the job's lobby; mpirun's next start "
            "reaches a new worker); without one in time, exits 138 (`PeerLost`)",
            "the lost pod: `Ignore` when disrupted, else `Count` (the retryable row); the others hold",
            "- while the replacement rejoins; the retryable row once the others exit",
        ),
    ]
