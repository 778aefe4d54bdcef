"""``tune run`` (torchtune's CLI) read the way torchtune reads it, and turned into what the
launcher runs: a torchrun command line for ``trainer-launcher torch``, or, for a single device,
one command for the launcher's ``exec`` supervision.

What torchtune does with ``tune run [TORCHRUN FLAGS] RECIPE --config CONFIG [OVERRIDES]``, and so
what this module does:

- the words are torchrun's grammar (tune copies torchrun's parser), the recipe and what follows
  it being torchrun's script and arguments;
- RECIPE is a built-in recipe's name (``full_finetune_distributed``: the script shipped beside
  the torchtune package, ``<site-packages>/recipes/<file>``), or else a path that tune turns into
  a module (``my/recipe.py`` -> ``python -m my.recipe``);
- CONFIG, the word after the first ``--config``, is a built-in config's name (looked up among the
  recipe's configs, then among all) or else a path, kept as typed;
- with any torchrun flag before the recipe the recipe runs under torchrun; with none, it runs as
  one process on one device (tune refuses torchrun flags for a recipe that is single-device only).

Where this differs from tune, on purpose:

- tune forces a private standalone rendezvous when no ``--rdzv_endpoint`` is given. Here the
  launcher's planner decides from ``PET_*`` as for any torchrun line: standalone for one node
  without a master (what tune means), the master's rendezvous when the environment says there
  are several nodes (where tune's standalone store could only wait for nodes that never come);
- an absolute recipe path runs as that script (tune would make it a module name starting with a
  dot, which Python refuses).

The built-in recipes come from torchtune's own registry, read from its file without importing
torchtune (an import costs seconds and pulls torch): :func:`load_registry`. Everything else here
is pure.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, replace

from launcher.core.outcome import ConfigError
from launcher.torch import args as torchrun_args

USAGE = "tune run [TORCHRUN FLAGS] RECIPE --config CONFIG [KEY=VALUE ...]"


@dataclass(frozen=True)
class Recipe:
    name: str
    file_path: str  # under <root>/recipes
    configs: tuple[tuple[str, str], ...]  # (name, file path under <root>/recipes/configs)
    supports_distributed: bool


@dataclass(frozen=True)
class Registry:
    """torchtune's built-in recipes and configs; ``root`` is the directory that holds ``recipes/``."""

    root: str
    recipes: tuple[Recipe, ...]

    def recipe(self, name: str) -> Recipe | None:
        return next((recipe for recipe in self.recipes if recipe.name == name), None)

    def config(self, name: str, recipe: Recipe | None) -> str | None:
        """tune's order: the recipe's own configs first, then every recipe's."""
        for candidates in ((recipe,) if recipe else ()) + self.recipes:
            for config_name, file_path in candidates.configs:
                if config_name == name:
                    return os.path.join(self.root, "recipes", "configs", file_path)
        return None


@dataclass(frozen=True)
class TuneRun:
    recipe: str  # as typed
    target: str  # the script's path, or the module's name when ``module``
    module: bool
    builtin: bool
    config: str  # as typed
    config_path: str  # what the recipe is given
    distributed: bool
    torchrun_args: tuple[str, ...] = ()  # distributed: the line for `trainer-launcher torch`
    command: tuple[str, ...] = ()  # one device: the command the launcher supervises

    def to_json(self) -> dict:
        return {
            "recipe": self.recipe,
            "script" if not self.module else "module": self.target,
            "builtin": self.builtin,
            "config": self.config,
            "configPath": self.config_path,
            "distributed": self.distributed,
        }


def resolve(
    words: list[str] | tuple[str, ...], registry: Registry | None, python: str, distributed: bool | None = None
) -> TuneRun:
    """``words``: what follows ``tune run``. ``registry``: torchtune's (None: torchtune is not
    installed). ``python``: the interpreter for a single-device run. ``distributed``: force the
    choice (``local`` emulates nodes, which is distributed whatever the flags)."""
    words = list(words)
    try:
        line = torchrun_args.read(words, require_program=False)
    except ConfigError as error:
        if error.value in torchrun_args.HELP:
            raise ConfigError(
                "tune run flag", error.value, "flags to run with; tune's own help is: tune run --help"
            ) from None
        raise
    if not line.program:
        raise ConfigError("RECIPE", None, f"a recipe name or path after the torchrun flags: {USAGE}")
    recipe_name, *recipe_args = line.program
    config_at = _config_index(recipe_args)
    config = recipe_args[config_at]
    recipe = registry.recipe(recipe_name) if registry else None
    if recipe is not None and registry is not None:
        target, module = os.path.join(registry.root, "recipes", recipe.file_path), False
    elif registry is None and not recipe_name.endswith(".py"):
        raise ConfigError(
            "RECIPE",
            recipe_name,
            "a recipe file path (.py): torchtune, which names the built-in "
            "recipes, is not installed here (pip install torchtune)",
        )
    elif os.path.isabs(recipe_name):
        target, module = recipe_name, False
    else:
        target, module = os.path.splitext(recipe_name)[0].replace("/", "."), True
    config_path = (registry.config(config, recipe) if registry else None) or config
    recipe_args[config_at] = config_path
    if distributed is None:
        distributed = len(words) > len(line.program)  # any word before the recipe
    if distributed and recipe is not None and not recipe.supports_distributed:
        raise ConfigError(
            "RECIPE",
            recipe_name,
            "a recipe that supports distributed training, or no torchrun flags "
            "before it (tune then runs it as one process)",
        )
    program = (target, *recipe_args)
    resolved = TuneRun(recipe_name, target, module, recipe is not None, config, config_path, distributed)
    if not distributed:
        return replace(resolved, command=(python, "-u", *(("-m",) if module else ()), *program))
    # The flags as typed (so the launcher's messages name them as the user spelled them), but tune
    # decides -m itself: a module for a recipe path, a script for a built-in one.
    if "module" in line.given:
        given = {dest: typed for dest, typed in line.given.items() if dest != "module"}
        flags = torchrun_args.render(given, list(given))
    else:
        flags = words[: len(words) - len(line.program)]
        flags = flags[:-1] if flags[-1:] == ["--"] else flags  # program_argv adds it back if needed
    flags += ["--module"] if module else []
    return replace(resolved, torchrun_args=(*flags, *torchrun_args.program_argv(program)))


def _config_index(recipe_args: list[str]) -> int:
    """Where the config's name is: after the first ``--config`` word, as tune looks for it."""
    if "--config" not in recipe_args or recipe_args.index("--config") + 1 == len(recipe_args):
        raise ConfigError(
            "--config", None, f"a config name or path after the recipe: {USAGE} (tune ls lists the built-in ones)"
        )
    return recipe_args.index("--config") + 1


def load_registry() -> Registry | None:
    """torchtune's recipe registry, or None when torchtune is not installed. The registry module
    holds only data; it is run from its file so that torchtune's package (torch, torchao, ...)
    is never imported."""
    spec = importlib.util.find_spec("torchtune")  # finds, does not import, a top-level package
    if spec is None or not spec.submodule_search_locations:
        return None
    package = next(iter(spec.submodule_search_locations))
    source = os.path.join(package, "_recipe_registry.py")
    try:
        loader_spec = importlib.util.spec_from_file_location("_trainer_launcher_tune_registry", source)
        if loader_spec is None or loader_spec.loader is None:
            raise ImportError(f"no loader for {source}")
        module = importlib.util.module_from_spec(loader_spec)
        loader_spec.loader.exec_module(module)
        recipes = module.get_all_recipes()
    except (OSError, ImportError, AttributeError) as error:
        raise ConfigError(
            "torchtune",
            package,
            f"a torchtune whose recipe registry ({source}) reads as a list of "
            f"recipes ({type(error).__name__}: {error})",
        ) from None
    return Registry(
        os.path.dirname(package),
        tuple(
            Recipe(r.name, r.file_path, tuple((c.name, c.file_path) for c in r.configs), bool(r.supports_distributed))
            for r in recipes
        ),
    )


# --- the CLI's side (`trainer-launcher torch|plan|local --tune`): I/O from here on ---------------


def resolve_here(words: list[str], distributed: bool | None = None) -> TuneRun:
    """:func:`resolve` with this machine's torchtune and interpreter."""
    import sys

    return resolve(words, load_registry(), sys.executable, distributed)


def run(overrides: dict, words: list[str]) -> int:
    """``tune run WORDS`` supervised: under torchrun as ``trainer-launcher torch`` runs it, or, for
    one device, as ``trainer-launcher exec`` runs a command."""
    try:
        resolved = resolve_here(words)
    except ConfigError as error:
        from launcher.core.report import refuse

        return refuse(overrides, error)
    if resolved.distributed:
        from launcher.torch.job import run_torch

        return run_torch(overrides, list(resolved.torchrun_args))
    from launcher.core.exec_job import run_exec

    return run_exec(overrides, list(resolved.command))


def plan(words: list[str], torch_plan) -> dict:
    """What ``run`` would run, as ``plan`` prints it; ``torch_plan(torchrun words)`` is the torch
    plan's document."""
    resolved = resolve_here(words)
    if resolved.distributed:
        document = torch_plan(list(resolved.torchrun_args))
    else:
        document = {"framework": "torch", "mode": "single-device", "argv": list(resolved.command)}
    return {**document, "tune": resolved.to_json()}


def local_words(overrides: dict, words: list[str]) -> list[str] | int:
    """The torchrun words each emulated node runs (emulated nodes are distributed whatever the
    flags), or the exit code of the error that was delivered instead."""
    try:
        return list(resolve_here(words, distributed=True).torchrun_args)
    except ConfigError as error:
        from launcher.core.report import refuse

        return refuse(overrides, error)
