"""``python -m torch.distributed.launch WORDS``, torchrun's deprecated predecessor, through the same
path as ``torchrun``. Pure.

Its words are torchrun's plus one switch, ``--use-env`` (``--use_env``): without it each script is
given ``--local-rank=N`` as an argument, with it only ``LOCAL_RANK`` in the environment (torchrun's
way). The launcher plans the torchrun words as for ``torchrun``; the torch agent then runs
``torch.distributed.launch``'s own entry point on them, so the script gets exactly what that
module gives it (its ``--local-rank``, its deprecation warning) on every torch we support.

``python -m torch.distributed.run WORDS`` is torchrun itself: the images' ``python`` shim sends
it to the ``torchrun`` shim.

Pure but for the last section (the pod).
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.core.outcome import ConfigError
from launcher.torch import args as torchrun_args
from launcher.torch.job import TorchPod, run_pod

MODULE = "torch.distributed.launch"
USE_ENV = ("--use-env", "--use_env")


@dataclass(frozen=True)
class LegacyLine:
    torchrun_words: tuple[str, ...]  # the words without --use-env: what the torch plan reads
    use_env: bool

    def module_args(self, flags: tuple[str, ...], program: tuple[str, ...]) -> list[str]:
        """The planned torchrun flags and program as ``torch.distributed.launch`` reads them (the
        switch before a ``--`` that ends the flags)."""
        end = ["--"] if flags[-1:] == ("--",) else []
        return [*flags[: len(flags) - len(end)], *(["--use-env"] if self.use_env else []), *end, *program]


def read(words: list[str]) -> LegacyLine:
    """Take ``--use-env`` out of the flags (before the script; a script's own ``--use-env`` stays)."""
    line = _split(list(words))
    no_python = torchrun_args.read(list(line.torchrun_words), require_program=False).given.get("no_python")
    if no_python is not None and not line.use_env:
        raise ConfigError(
            no_python.option,
            True,
            "--use-env with it: torch.distributed.launch gives each process "
            "--local-rank, which only a python script reads",
        )
    return line


def _split(words: list[str]) -> LegacyLine:
    for index, word in enumerate(words):
        if word not in USE_ENV:
            continue
        rest = words[:index] + words[index + 1 :]
        program = torchrun_args.read(rest, require_program=False).program
        if index <= len(rest) - len(program):  # among the flags, not the script's arguments
            return LegacyLine(tuple(rest), True)
        break
    return LegacyLine(tuple(words), False)


def plan(words: list[str], torch_plan) -> dict:
    """What ``plan --distributed-launch`` prints: the torch plan of the torchrun words, and the line
    ``torch.distributed.launch`` is given."""
    line = read(words)
    document = torch_plan(list(line.torchrun_words))
    planned = tuple(document["argv"][1:])  # after "torchrun"
    program = torchrun_args.read(planned, require_program=False).program
    flags = planned[: len(planned) - len(program)]
    return {**document, "argv": ["python", "-m", MODULE, *line.module_args(flags, program)], "useEnv": line.use_env}


# --- the CLI's side (`trainer-launcher torch --distributed-launch`) --------------------------------


def run(overrides: dict, words: list[str]) -> int:
    return run_pod(overrides, LegacyLaunchPod(words))


class LegacyLaunchPod(TorchPod):
    """The torch pod, planned from the torchrun words of the line; the agent runs the module's main."""

    entry = MODULE

    def __init__(self, words: list[str]):
        super().__init__(list(words))
        self.words = words

    def plan(self, life):
        self.line = read(self.words)
        self.rest = list(self.line.torchrun_words)
        return super().plan(life)

    def agent_args(self, plan) -> list[str]:
        return self.line.module_args(plan.torchrun_args, plan.program)
