"""``trainer-launcher local --framework jax``: each pod runs ``trainer-launcher jax`` with exactly the
environment Trainer's JAX policy injects (JAX_NUM_PROCESSES, JAX_PROCESS_ID, JAX_COORDINATOR_ADDRESS,
JOB_COMPLETION_INDEX, HOSTNAME)."""

from __future__ import annotations

from launcher.core.outcome import ConfigError
from launcher.core.settings import Override
from launcher.local.nodes import Pods, pods, port, run_framework_pods

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


def run_local(
    launcher_overrides: dict[str, Override],
    jax_overrides: dict[str, Override],
    rest: list[str],
    nnodes: str,
    nproc_per_node: str,
    trainjob: str,
    master_port: str | None,
    isolation: str,
) -> int:
    def setup(job: Pods):
        if nproc_per_node.strip() != "1":
            raise ConfigError(
                "--nproc-per-node", nproc_per_node, "1: a JAX pod runs one process, which uses every device of its pod"
            )
        coordinator_port = port(master_port)
        summary = f"{job.nnodes} JAX processes, one per node, coordinator {job.address(0)}:{coordinator_port}"
        return (lambda index, base: node_env(job, index, coordinator_port, base)), summary

    return run_framework_pods(
        "jax", launcher_overrides, jax_overrides, rest, lambda: pods(nnodes, trainjob, isolation), setup
    )
