"""``trainer-launcher xgboost``: how the CLI reaches this package (nothing heavy imported here)."""

from __future__ import annotations

import argparse

from launcher.core.runner_command import RunnerCommand
from launcher.xgboost.knobs import XGBOOST_KNOBS

NAME = "xgboost"
HELP = "run XGBoost workers from the DMLC_* environment (one per GPU, else one per pod) and pod 0's tracker, supervised"
USAGE = "trainer-launcher xgboost [OPTIONS] -- PROGRAM [ARGS...]   (e.g. -- python train.py)"
KNOBS = XGBOOST_KNOBS


def add_options(parser: argparse.ArgumentParser) -> None:
    pass


_COMMAND = RunnerCommand(NAME, KNOBS)
run, plan, local = _COMMAND.run, _COMMAND.plan, _COMMAND.local
