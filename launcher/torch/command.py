"""``trainer-launcher torch``: how the CLI reaches this package (nothing heavy imported here)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from launcher.core.knobs import Override

if TYPE_CHECKING:
    from launcher.smoke.job import PodRequest

NAME = "torch"
HELP = "run torchrun from the PET_* environment, supervised"
USAGE = "trainer-launcher torch [OPTIONS] -- [TORCHRUN FLAGS] SCRIPT [ARGS...]"
KNOBS: dict = {}  # torch's own settings come from PET_* and torchrun's flags


def add_options(parser: argparse.ArgumentParser) -> None:
    add_shared_options(parser)


def add_shared_options(parser: argparse.ArgumentParser) -> None:
    """Options that `plan` and `local` take too."""
    parser.add_argument(
        "--tune",
        action="store_true",
        help="the words after -- are torchtune's `tune run` words: [TORCHRUN FLAGS] RECIPE "
        "--config CONFIG [KEY=VALUE ...] (the `tune` shim sends them)",
    )
    parser.add_argument(
        "--accelerate",
        action="store_true",
        help="the words after -- are `accelerate launch` words: [ACCELERATE FLAGS] SCRIPT [ARGS...], "
        "read by Accelerate, the world from PET_* where they set none (the `accelerate` shim "
        "sends them)",
    )
    parser.add_argument(
        "--distributed-launch",
        action="store_true",
        help="the words after -- are `python -m torch.distributed.launch` words: torchrun's and "
        "--use-env; without it each script is given --local-rank (the `python` shim sends them)",
    )


def run(args: argparse.Namespace, overrides: dict[str, Override], rest: list[str]) -> int:
    if args.accelerate:
        from launcher.torch import accelerate_launch as accelerate

        return accelerate.run(overrides, rest)
    if args.tune:
        from launcher.torch import tune

        return tune.run(overrides, rest)
    if args.distributed_launch:
        from launcher.torch import legacy_launch

        return legacy_launch.run(overrides, rest)
    from launcher.torch.job import run_torch

    return run_torch(overrides, rest)


def plan(args: argparse.Namespace, overrides: dict[str, Override], rest: list[str]) -> int:
    from launcher.core.report import print_plan
    from launcher.torch.job import make_plan

    def build(launcher, words: list[str] = rest) -> dict:
        torch_plan, _ = make_plan(words, require_program=False, launcher=launcher)
        return {**torch_plan.to_json(), "launcher": launcher.plan_json()}

    if args.accelerate:
        from launcher.torch import accelerate_launch as accelerate

        return print_plan(
            overrides, lambda launcher: accelerate.plan(rest, lambda words: build(launcher, words), overrides)
        )
    if args.tune:
        from launcher.torch import tune

        return print_plan(overrides, lambda launcher: tune.plan(rest, lambda words: build(launcher, words)))
    if args.distributed_launch:
        from launcher.torch import legacy_launch

        return print_plan(overrides, lambda launcher: legacy_launch.plan(rest, lambda words: build(launcher, words)))
    return print_plan(overrides, build)


def local(args: argparse.Namespace, overrides: dict[str, Override], rest: list[str]) -> int:
    from launcher.torch.local import run_local

    if args.tune:
        from launcher.torch import tune

        words = tune.local_words(overrides, rest)
        if isinstance(words, int):
            return words
        rest = words
    # Each emulated pod reads an accelerate line itself, with its own PET_*.
    mode = ["--accelerate"] if args.accelerate else ["--distributed-launch"] if args.distributed_launch else []
    return run_local(
        overrides, rest, args.nnodes, args.nproc_per_node, args.trainjob, args.master_port, args.isolation, mode
    )


def pod_request() -> PodRequest:
    """What Trainer's torch policy asked of this pod (``PET_*``), for the preflight (``smoke``)."""
    from launcher.core import settings
    from launcher.smoke.job import PodRequest
    from launcher.torch.settings import TorchSettings

    torch = settings.load(TorchSettings)
    return PodRequest(
        torch.nproc_per_node,
        settings.source_of(TorchSettings, "nproc_per_node") or "default",
        torch.master_addr,
        "PET_MASTER_ADDR",
    )
