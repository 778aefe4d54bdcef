"""``trainer-launcher xgboost``: how the CLI reaches this package (nothing heavy imported here)."""

from __future__ import annotations

import argparse

from launcher.core.knobs import Override, given
from launcher.xgboost.knobs import XGBOOST_KNOBS

NAME = "xgboost"
HELP = "run XGBoost workers from the DMLC_* environment (one per GPU, else one per pod) and pod 0's tracker, supervised"
USAGE = "trainer-launcher xgboost [OPTIONS] -- PROGRAM [ARGS...]   (e.g. -- python train.py)"
KNOBS = XGBOOST_KNOBS


def add_options(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace, overrides: dict[str, Override], rest: list[str]) -> int:
    from launcher.xgboost.job import run_xgboost

    return run_xgboost(overrides, given(args, XGBOOST_KNOBS, "xgboost_"), rest)


def plan(args: argparse.Namespace, overrides: dict[str, Override], rest: list[str]) -> int:
    from launcher.core.report import print_plan
    from launcher.xgboost.job import make_plan

    xgboost_overrides = given(args, XGBOOST_KNOBS, "xgboost_")

    def build(launcher) -> dict:
        xgboost_plan = make_plan(xgboost_overrides, rest, require_program=False)
        return {**xgboost_plan.to_json(), "launcher": launcher.plan_json()}

    return print_plan(overrides, build)


def local(args: argparse.Namespace, overrides: dict[str, Override], rest: list[str]) -> int:
    from launcher.xgboost.local import run_local

    return run_local(
        overrides,
        given(args, XGBOOST_KNOBS, "xgboost_"),
        rest,
        args.nnodes,
        args.nproc_per_node,
        args.trainjob,
        args.master_port,
        args.isolation,
    )
