"""``python accelerate_run.py [--] SCRIPT|-m MODULE|-c CODE [ARGS...]``: a process of an accelerate
job on CPU under ``trainer-launcher torch --accelerate`` (``--cpu``, or any line on a node without
GPUs); launcher/torch/accelerate_launch.py puts it before the program in the torchrun line.

Such a job tells its processes to run on CPU with ACCELERATE_USE_CPU, as ``accelerate launch --cpu``
does. ``AcceleratorState`` (what ``Accelerator()`` builds) reads it; ``PartialState`` does not, and
from accelerate 1.13 on it forms a world on CPU only when called with ``cpu=True``: ``PartialState()``
alone, Accelerate's own pattern for distributed inference, runs each process as a world of one,
without a word. Here ``PartialState`` reads ACCELERATE_USE_CPU as ``AcceleratorState`` does, once the
program imports ``accelerate.state`` (nothing is imported for it earlier), and the program runs as
``python`` would run it (../runner/program.py).

Run by path in the ranks' interpreter: the standard library and the launcher's stdlib-only
../runner/program.py, loaded by path.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import TYPE_CHECKING, Any

STATE = "accelerate.state"
USE_CPU = "ACCELERATE_USE_CPU"

if TYPE_CHECKING:  # the same file, as a type checker finds it
    from launcher.runner import program
else:  # through the one loader beside it (launcher/runner/_trainer_launcher_load.py)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "runner"))
    from _trainer_launcher_load import program

    del sys.path[0]


def follow_use_cpu(state: Any) -> bool:
    """``PartialState(cpu=...)`` made True where ACCELERATE_USE_CPU is, read with the function
    ``AcceleratorState`` reads it with. False (and the class left as it is) for a ``PartialState``
    whose first argument is not ``cpu``."""
    partial: Any = getattr(state, "PartialState", None)
    init: Any = getattr(partial, "__init__", None)
    code = getattr(init, "__code__", None)
    flag = getattr(state, "parse_flag_from_env", None)
    if code is None or code.co_varnames[1:2] != ("cpu",) or flag is None:
        return False

    @functools.wraps(init)
    def reads_use_cpu(self, cpu: bool = False, **kwargs) -> None:
        init(self, cpu or flag(USE_CPU), **kwargs)

    partial.__init__ = reads_use_cpu
    return True


class AfterImport:
    """A finder that finds nothing itself: it lets the others find ``name``, and has ``then``
    called with the module once the module has run."""

    def __init__(self, name: str, then) -> None:
        self.name, self.then = name, then

    def find_spec(self, name: str, path=None, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)  # once: the other finders below find it
        spec = next((found for found in _specs(name, path, target) if found is not None), None)
        loader = getattr(spec, "loader", None)
        run = getattr(loader, "exec_module", None)
        if run is None:
            return spec

        def exec_module(module) -> None:
            run(module)
            self.then(module)

        loader.exec_module = exec_module  # type: ignore[union-attr]  # this module's own loader
        return spec


def _specs(name: str, path, target):
    for finder in list(sys.meta_path):
        find = getattr(finder, "find_spec", None)
        if find is not None:
            yield find(name, path, target)


def patched(state) -> None:
    if not follow_use_cpu(state):
        sys.stderr.write(
            f"trainer-launcher: warning: accelerate's {STATE}.PartialState takes no cpu argument first: "
            f"PartialState() does not read {USE_CPU} (Accelerator() does)\n"
        )


def main(argv: list[str] | None = None) -> None:
    try:
        kind, target, args = program.parse_target(sys.argv[1:] if argv is None else argv)
    except ValueError as usage:
        sys.stderr.write(f"accelerate_run.py: error: {usage}\n")
        sys.exit(2)
    program.set_sys_path(kind, target, os.path.dirname(os.path.realpath(__file__)))
    if STATE in sys.modules:  # imported by a sitecustomize before this file ran
        patched(sys.modules[STATE])
    else:
        sys.meta_path.insert(0, AfterImport(STATE, patched))
    program.exit_as_python(program.run_program(kind, target, args))


if __name__ == "__main__":
    main()
