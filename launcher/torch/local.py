"""``trainer-launcher local`` for torch: each pod runs ``trainer-launcher torch`` with exactly the
environment Trainer's torch policy injects (PET_*, JOB_COMPLETION_INDEX, HOSTNAME)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from launcher.core import settings
from launcher.core.outcome import ConfigError, Outcome
from launcher.core.report import run_command
from launcher.core.settings import LauncherSettings, Override
from launcher.local.nodes import Pods, knob_args, pods, port, run_pods
from launcher.torch.settings import parse_nproc


def node_env(job: Pods, index: int, nproc_per_node: str, master_port: int, base: dict[str, str]) -> dict[str, str]:
    """What the controller injects into the ``node`` container of pod ``index``."""
    env = job.base_env(index, base, drop=("PET_",))
    env.update(
        {
            "PET_NNODES": str(job.nnodes),
            "PET_NPROC_PER_NODE": nproc_per_node,
            "PET_NODE_RANK": str(index),
            "PET_MASTER_ADDR": job.address(0),
            "PET_MASTER_PORT": str(master_port),
            # torchrun prefixes each rank's lines with this when it tees them (--tee 3).
            "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[rank-${rank}]:",
        }
    )
    return env


def run_local(
    launcher_overrides: dict[str, Override],
    rest: list[str],
    nnodes: str,
    nproc_per_node: str,
    trainjob: str,
    master_port: str | None,
    isolation: str,
    mode: Sequence[str] = (),
) -> int:
    """``mode``: ``trainer-launcher torch``'s options that say what the words are (``--accelerate``)."""

    def body(launcher: LauncherSettings) -> Outcome:
        job = pods(nnodes, trainjob, isolation)
        try:
            nproc = str(parse_nproc(nproc_per_node))
        except ValueError as error:
            raise ConfigError("--nproc-per-node", nproc_per_node, str(error)) from None
        # Free too: the port each restart in place moves the store on to, and the lobby above them.
        master = port(master_port, span=launcher.max_restarts + 2)
        if not rest:
            raise ConfigError(
                "SCRIPT",
                None,
                "a training script: trainer-launcher local --nnodes N --nproc-per-node P -- SCRIPT [ARGS...]",
            )
        knobs = knob_args(launcher_overrides)

        def pod_command(index: int) -> tuple[list[str], dict[str, str]]:
            argv = [sys.executable, "-m", "launcher", "torch", *mode, *knobs, "--", "--tee", "3", *rest]
            return argv, node_env(job, index, nproc, master, settings.environ())

        summary = f"{job.nnodes} nodes x {nproc} processes, master {job.address(0)}:{master}"
        return run_pods(job, launcher, summary, pod_command)

    return run_command(launcher_overrides, body)
