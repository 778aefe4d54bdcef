"""``trainer-launcher local --framework jax``: each pod runs ``trainer-launcher jax`` with exactly the
environment Trainer's JAX policy injects (JAX_NUM_PROCESSES, JAX_PROCESS_ID, JAX_COORDINATOR_ADDRESS,
JOB_COMPLETION_INDEX, HOSTNAME)."""

from __future__ import annotations

import argparse
import functools
from typing import TYPE_CHECKING

from launcher.core.outcome import ConfigError
from launcher.local.nodes import Pods, port, run_framework_pods

if TYPE_CHECKING:
    from launcher.core.settings import LauncherSettings

# The controller owns these; a caller's own would otherwise leak into every pod.
CONTROLLER_VARIABLES = ("JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "JAX_COORDINATOR_ADDRESS")


def node_env(job: Pods, index: int, coordinator_port: int, base: dict[str, str]) -> dict[str, str]:
    """What the controller injects into the ``node`` container of pod ``index``."""
    env = {k: v for k, v in job.base_env(index, base).items() if k not in CONTROLLER_VARIABLES}
    env.update(
        {
            "JAX_NUM_PROCESSES": str(job.nnodes),
            "JAX_PROCESS_ID": str(index),
            "JAX_COORDINATOR_ADDRESS": f"{job.address(0)}:{coordinator_port}",
        }
    )
    return env


def setup(job: Pods, args: argparse.Namespace, launcher: LauncherSettings):
    """One JAX process a pod, and the coordinator's port (``local``'s --master-port, else free, with
    the port each restart in place moves it on to (launcher.jax.plan) and the job's lobby above them
    (launcher.core.lobby) free too)."""
    if args.nproc_per_node.strip() != "1":
        raise ConfigError(
            "--nproc-per-node", args.nproc_per_node, "1: a JAX pod runs one process, which uses every device of its pod"
        )
    coordinator_port = port(args.master_port, span=launcher.max_restarts + 2)
    summary = f"{job.nnodes} JAX processes, one per node, coordinator {job.address(0)}:{coordinator_port}"
    return (lambda index, base: node_env(job, index, coordinator_port, base)), summary


# What RunnerCommand.local calls: (launcher overrides, jax overrides, the program, local's arguments).
run_local = functools.partial(run_framework_pods, "jax", setup=setup)
