"""``trainer-launcher jax``: how the CLI reaches this package (nothing heavy imported here)."""

from __future__ import annotations

import argparse

from launcher.core.knobs import Override, given
from launcher.jax.knobs import JAX_KNOBS

NAME = "jax"
HELP = "run a JAX program from the JAX_* environment (one process per pod), supervised"
USAGE = "trainer-launcher jax [OPTIONS] -- PROGRAM [ARGS...]   (e.g. -- python train.py)"
KNOBS = JAX_KNOBS


def add_options(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace, overrides: dict[str, Override], rest: list[str]) -> int:
    from launcher.jax.job import run_jax

    return run_jax(overrides, given(args, JAX_KNOBS, "jax_"), rest)


def plan(args: argparse.Namespace, overrides: dict[str, Override], rest: list[str]) -> int:
    from launcher.core.report import print_plan
    from launcher.jax.job import make_plan

    jax_overrides = given(args, JAX_KNOBS, "jax_")

    def build(launcher) -> dict:
        jax_plan = make_plan(jax_overrides, rest, launcher, require_program=False)
        return {**jax_plan.to_json(), "launcher": launcher.plan_json()}

    return print_plan(overrides, build)


def local(args: argparse.Namespace, overrides: dict[str, Override], rest: list[str]) -> int:
    from launcher.jax.local import run_local

    return run_local(
        overrides,
        given(args, JAX_KNOBS, "jax_"),
        rest,
        args.nnodes,
        args.nproc_per_node,
        args.trainjob,
        args.master_port,
        args.isolation,
    )
