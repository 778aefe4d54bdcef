"""The frameworks the launcher runs: the one table that names them.

A framework is a package, ``launcher/<name>/``, plus its entry here. The package's ``command``
module (or the object it holds as ``COMMAND``) says how the CLI reaches it: ``NAME``, ``HELP``,
``USAGE``, ``KNOBS`` (its LAUNCHER_* variables, each also a flag), ``add_options`` and ``run`` for
its subcommand; ``plan`` and ``local`` where ``plan --framework`` and ``local --framework`` serve
it; ``add_shared_options`` for switches those two take too; ``add_local_options`` and
``claims_local`` where ``local`` has options of its own for it (and is then that framework's
without ``--framework``); and, in the
default framework's, ``pod_request``: what the controller asked of this pod, which the preflight
(``smoke``) checks against the node. The entry holds what the rest of the launcher must know of
a framework without importing its package: the marks its library leaves in the ranks' stacks and
output, read by the status services.

Plain data, standard library only, importing nothing of the launcher: every layer may read it
(cli.py dispatches through it; status/ matches stacks and lines against it). The releases of each
framework's library that users may bring are in the version table, launcher/core/versions.py,
which the runners load by path.
"""

from __future__ import annotations

import functools
import sys
from typing import NamedTuple

# Where a framework that is not the launcher's own registers: an entry point in this group, named
# as its subcommand, pointing at its Framework entry (``[project.entry-points."trainer_launcher.frameworks"]``).
ENTRY_POINTS = "trainer_launcher.frameworks"


# A NamedTuple, not a dataclass: the CLI reads this table at every start, and dataclasses would
# import inspect and ast with it (milliseconds, on every `trainer-launcher` call).
class Framework(NamedTuple):
    name: str  # the subcommand, the package launcher/<name>/ and its ``--framework`` value
    # Regexes, each enough to say a Python frame (``path:line in function``) is inside one of the
    # library's collectives: a hang's stacks then tell the ranks waiting from the one that stopped.
    collective_frames: tuple[str, ...] = ()
    # Substrings of output lines the library itself writes (its loggers, its C++ side): their
    # ``key=value`` details are no metrics of the program's.
    library_lines: tuple[str, ...] = ()

    # Its command module, where it is not ``launcher.<name>.command`` (a framework of its own package).
    module: str = ""

    @property
    def command(self) -> str:
        """Its command module: how the CLI reaches the package."""
        return self.module or f"launcher.{self.name}.command"


FRAMEWORKS: tuple[Framework, ...] = (
    Framework(
        "torch",
        collective_frames=(r"distributed_c10d\.py", r"torch[/\\]distributed[/\\]"),
        library_lines=("torch.distributed", "torch/csrc/"),
    ),
    Framework("mpi", collective_frames=(r"mpi4py",)),
    Framework("jax", collective_frames=(r"multihost_utils\.py",)),
    Framework("xgboost", collective_frames=(r"[/\\]collective\.py",)),
)
# What ``plan`` and ``local`` run without ``--framework``, and whose pod variables the
# preflight checks (the controller's torch policy is the default runtime's).
DEFAULT = "torch"


@functools.lru_cache(maxsize=1)
def plugged_in() -> tuple[Framework, ...]:
    """The frameworks other packages register (:data:`ENTRY_POINTS`), in name order. One that
    cannot be loaded, is no Framework, or takes a name already taken is left out with one line
    on stderr: another package's bug must not stop the launcher. Reading the installed
    distributions costs milliseconds, so the CLI asks only when a command line may name one."""
    from importlib import metadata

    found: dict[str, Framework] = {}
    taken = {framework.name for framework in FRAMEWORKS}
    for entry in sorted(metadata.entry_points(group=ENTRY_POINTS), key=lambda e: e.name):
        try:
            framework = entry.load()
        except Exception as error:  # noqa: BLE001 - whatever the plug-in's import raised
            _skip(entry.value, f"it cannot be loaded: {type(error).__name__}: {error}")
            continue
        if not isinstance(framework, Framework) or framework.name != entry.name:
            _skip(entry.value, f"expected a launcher.frameworks.Framework named {entry.name!r}")
        elif framework.name in taken or framework.name in found:
            _skip(entry.value, f"the name {framework.name!r} is taken")
        else:
            found[framework.name] = framework
    return tuple(found.values())


def every() -> tuple[Framework, ...]:
    """The launcher's frameworks, then the plugged-in ones."""
    return FRAMEWORKS + plugged_in()


def _skip(where: str, why: str) -> None:
    print(
        f"trainer-launcher: warning: framework plug-in {ENTRY_POINTS}={where} left out: {why}",
        file=sys.stderr,
        flush=True,
    )
