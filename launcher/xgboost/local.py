"""``trainer-launcher local --framework xgboost``: each pod runs ``trainer-launcher xgboost`` with exactly
the environment Trainer's XGBoost policy injects (DMLC_TRACKER_URI, DMLC_TRACKER_PORT, DMLC_TASK_ID,
DMLC_NUM_WORKER, JOB_COMPLETION_INDEX, HOSTNAME).

``--nproc-per-node P`` stands for P GPUs per pod: the controller then counts DMLC_NUM_WORKER as
nnodes x P, and each pod's launcher is told it has P (LAUNCHER_XGBOOST_WORKERS_PER_POD), so the
per-GPU task ids run for real on CPU.
"""

from __future__ import annotations

import argparse
import functools
from typing import TYPE_CHECKING

from launcher.core import settings
from launcher.core.outcome import ConfigError
from launcher.local.nodes import Pods, port, run_framework_pods
from launcher.xgboost.knobs import XGBOOST_KNOBS
from launcher.xgboost.plan import PORTS_PER_GENERATION

if TYPE_CHECKING:
    from launcher.core.settings import LauncherSettings

# The controller owns these; a caller's own would otherwise leak into every pod.
CONTROLLER_VARIABLES = ("DMLC_TRACKER_URI", "DMLC_TRACKER_PORT", "DMLC_TASK_ID", "DMLC_NUM_WORKER")
MAX_PER_POD = 64


def node_env(job: Pods, index: int, per_pod: int, tracker_port: int, base: dict[str, str]) -> dict[str, str]:
    """What the controller injects into the ``node`` container of pod ``index``."""
    env = {k: v for k, v in job.base_env(index, base).items() if k not in CONTROLLER_VARIABLES}
    env.update(
        {
            "DMLC_TRACKER_URI": job.address(0),
            "DMLC_TRACKER_PORT": str(tracker_port),
            "DMLC_TASK_ID": str(index),
            "DMLC_NUM_WORKER": str(job.nnodes * per_pod),
        }
    )
    if per_pod > 1:  # the GPUs this emulation stands for
        env[XGBOOST_KNOBS["workers_per_pod"].env] = str(per_pod)
    return env


def tracker_port_for(master_port: str | None, restarts: int = 0) -> int:
    """``--master-port``, or a free port with every port the job may use free after it too: pod
    0's stop board listens on the tracker's port + 1 (launcher.xgboost.board), and each of the
    ``restarts`` in place moves both on by PORTS_PER_GENERATION (launcher.xgboost.plan), above
    which pod 0 serves the job's lobby (launcher.core.lobby)."""
    return port(master_port, span=PORTS_PER_GENERATION * (restarts + 1) + 1)


def setup(job: Pods, args: argparse.Namespace, launcher: LauncherSettings):
    """Workers a pod (``local``'s --nproc-per-node: the GPUs a pod stands for) and the tracker's port."""
    try:
        per_pod = settings.int_in(1, MAX_PER_POD, "a worker count")(args.nproc_per_node)
    except ValueError as error:
        raise ConfigError(
            "--nproc-per-node", args.nproc_per_node, f"{error}: the GPUs each emulated pod stands for (1: a CPU pod)"
        ) from None
    tracker_port = tracker_port_for(args.master_port, launcher.max_restarts)
    summary = (
        f"{job.nnodes} pods x {per_pod} XGBoost worker(s), tracker {job.address(0)}:{tracker_port} (DMLC_TRACKER_URI)"
    )
    return (lambda index, base: node_env(job, index, per_pod, tracker_port, base)), summary


# What RunnerCommand.local calls: (launcher overrides, xgboost overrides, the program, local's arguments).
run_local = functools.partial(run_framework_pods, "xgboost", setup=setup)
