"""The command module of a framework whose own settings are knobs and whose pods run the user's
Python through a runner (one process or worker per pod or GPU): what the CLI reaches (``run``,
``plan``, ``local``), made once from the framework's name and knobs. Its package supplies, in
``job``, ``run_<name>`` and ``make_plan`` and, in ``local``, ``run_local``; they are imported when a
command runs, so nothing heavy is imported before."""

from __future__ import annotations

import argparse
import importlib
from types import ModuleType

from launcher.core.knobs import Knob, Override, given

PLACEHOLDER = ("python", "SCRIPT")  # the program a plan shows when none was given


def program_words(name: str, rest: list[str], require_program: bool) -> list[str]:
    """The program after ``--``; none is one ConfigError line, or the placeholder for ``plan``."""
    if rest:
        return rest
    if require_program:
        from launcher.core.outcome import ConfigError

        usage = f"trainer-launcher {name} [OPTIONS] -- PROGRAM [ARGS...], e.g. -- python train.py"
        raise ConfigError("PROGRAM", None, f"a program after --: {usage}")
    return list(PLACEHOLDER)


class RunnerCommand:
    """``run``, ``plan`` and ``local`` of the framework ``name`` whose knobs are ``knobs``."""

    def __init__(self, name: str, knobs: dict[str, Knob]):
        self.name, self.knobs = name, knobs

    def _module(self, part: str) -> ModuleType:
        return importlib.import_module(f"launcher.{self.name}.{part}")

    def _given(self, args: argparse.Namespace) -> dict[str, Override]:
        return given(args, self.knobs, f"{self.name}_")

    def run(self, args: argparse.Namespace, overrides: dict[str, Override], rest: list[str]) -> int:
        return getattr(self._module("job"), f"run_{self.name}")(overrides, self._given(args), rest)

    def plan(self, args: argparse.Namespace, overrides: dict[str, Override], rest: list[str]) -> int:
        from launcher.core.report import print_plan

        make_plan, framework_overrides = self._module("job").make_plan, self._given(args)

        def build(launcher) -> dict:
            planned = make_plan(framework_overrides, rest, launcher, require_program=False)
            return {**planned.to_json(), "launcher": launcher.plan_json()}

        return print_plan(overrides, build)

    def local(self, args: argparse.Namespace, overrides: dict[str, Override], rest: list[str]) -> int:
        return self._module("local").run_local(overrides, self._given(args), rest, args)
