"""The command of a framework whose own settings are knobs and whose pods run the user's Python
through a runner (one process or worker per pod or GPU): what the CLI reaches (``run``, ``plan``,
``local``), made once from the framework's name and knobs, and what every such plan reads
(:func:`plan_inputs`). Its package supplies, in ``job``, ``run_<name>`` and ``make_plan`` and, in
``local``, ``run_local``; they are imported when a command runs, so nothing heavy is imported
before."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from launcher.core.knobs import Knob, Override, given

PLACEHOLDER = ("python", "SCRIPT")  # the program a plan shows when none was given


@dataclass(frozen=True)
class PlanInputs:
    """What a runner framework's plan is made from: its settings, loaded and checked; the program;
    the host, as read; where each setting came from."""

    settings: Any
    program: tuple[str, ...]
    host: Any  # launcher.core.devices.HostFacts
    host_env: Any  # launcher.core.settings.HostEnv
    sources: dict[str, str]


def plan_inputs(
    name: str,
    model: Any,
    load: Callable[[Any], Any],
    overrides: dict[str, Override],
    rest: list[str],
    launcher: Any,
    require_program: bool,
) -> PlanInputs:
    """Read and check everything a plan of framework ``name`` needs (``model``: its settings'
    class, ``load`` the function that loads and checks them). This interpreter's Python is checked
    here; the runner checks the program's library where it runs."""
    from launcher.core import settings, versions
    from launcher.core.devices import probe_host

    versions.check("python", allow=launcher.allow_untested_versions)
    loaded = load(overrides)
    program = tuple(program_words(name, rest, require_program))
    host_env = settings.load(settings.HostEnv)
    return PlanInputs(loaded, program, probe_host(host_env), host_env, settings.sources(model, overrides))


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
    """The command of the framework ``name`` whose knobs are ``knobs``: what launcher/frameworks.py
    says a command module holds (``NAME``, ``HELP``, ``USAGE``, ``KNOBS``, ``add_options``, ``run``,
    ``plan``, ``local``), as the ``COMMAND`` of the framework's command module."""

    def __init__(self, name: str, knobs: dict[str, Knob], help: str, usage: str):
        self.NAME, self.HELP, self.USAGE, self.KNOBS = name, help, usage, knobs

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        """None of its own: its options are its knobs."""

    def _module(self, part: str) -> ModuleType:
        return importlib.import_module(f"launcher.{self.NAME}.{part}")

    def _given(self, args: argparse.Namespace) -> dict[str, Override]:
        return given(args, self.KNOBS, f"{self.NAME}_")

    def run(self, args: argparse.Namespace, overrides: dict[str, Override], rest: list[str]) -> int:
        return getattr(self._module("job"), f"run_{self.NAME}")(overrides, self._given(args), rest)

    def plan(self, args: argparse.Namespace, overrides: dict[str, Override], rest: list[str]) -> int:
        from launcher.core.report import print_plan

        make_plan, framework_overrides = self._module("job").make_plan, self._given(args)

        def build(launcher) -> dict:
            planned = make_plan(framework_overrides, rest, launcher, require_program=False)
            return {**planned.to_json(), "launcher": launcher.plan_json()}

        return print_plan(overrides, build)

    def local(self, args: argparse.Namespace, overrides: dict[str, Override], rest: list[str]) -> int:
        return self._module("local").run_local(overrides, self._given(args), rest, args)
