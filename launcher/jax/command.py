"""``trainer-launcher jax``: how the CLI reaches this package (nothing heavy imported here)."""

from __future__ import annotations

import argparse

from launcher.core.runner_command import RunnerCommand
from launcher.jax.knobs import JAX_KNOBS

NAME = "jax"
HELP = "run a JAX program from the JAX_* environment (one process per pod), supervised"
USAGE = "trainer-launcher jax [OPTIONS] -- PROGRAM [ARGS...]   (e.g. -- python train.py)"
KNOBS = JAX_KNOBS


def add_options(parser: argparse.ArgumentParser) -> None:
    pass


_COMMAND = RunnerCommand(NAME, KNOBS)
run, plan, local = _COMMAND.run, _COMMAND.plan, _COMMAND.local
