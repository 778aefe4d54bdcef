"""A rank started ahead of its job: the next generation's, while a job that restarts in place
(launcher.core.lifecycle) trains. It imports torch, the bulk of a rank's start, and waits. When
torchrun starts the generation's ranks, the agent hands each one's command to a standby rank
instead of a new interpreter (launcher.torch.compat.bind_workers): one JSON line on its pipe with
what ``subprocess.Popen`` was given (the program's words after ``python -u``, the rank's whole
environment, where its output goes). From there the rank is what torchrun started: its environment
the rank's alone, its output in torchrun's files, the ranks' hooks registered with its rank, and
the program run exactly as ``python`` runs it (launcher/runner/program.py). End of file instead of
a line: the job needs no such rank any more, and it leaves quietly.

Usage (internal, by the torch agent): python -u standby.py FD

Runs in the user's interpreter: stdlib only as it loads, Python 3.10 syntax and library (the
agent starts it only there), the launcher's files loaded by path.
"""

import contextlib
import json
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the same file, as a type checker finds it
    from launcher.runner import program
else:  # through the one loader beside it (launcher/runner/_trainer_launcher_load.py)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "runner"))
    from _trainer_launcher_load import program

    del sys.path[0]

# The stack hook's module, as the ranks' sitecustomize imports it (launcher/runner/hook/).
STACKS_MODULE = "_trainer_launcher_stacks"


def main(fd: int) -> None:
    with contextlib.suppress(ImportError):  # the program's own import says so, in its words
        import torch  # noqa: F401 - what standing by is for
    with os.fdopen(fd, "rb") as pipe:
        line = pipe.readline()
    if not line:
        os._exit(0)
    request = json.loads(line)
    become(request)
    try:
        kind, target, args = program.parse_target(request["argv"])
    except ValueError as usage:
        print(f"trainer-launcher: error: {usage}", file=sys.stderr)
        sys.exit(2)
    program.set_sys_path(kind, target, os.path.dirname(os.path.realpath(__file__)))
    program.exit_as_python(program.run_program(kind, target, args))


def become(request: dict) -> None:
    """Take on the rank's environment, working directory and output, as Popen would have."""
    os.environ.clear()
    os.environ.update(request["env"])
    if request.get("cwd"):
        os.chdir(request["cwd"])
    for target, path in ((1, request.get("stdout")), (2, request.get("stderr"))):
        if path:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.dup2(fd, target)
            os.close(fd)
    # The stack dump, now that the rank is one (it stood by without: a hang's dump skips it).
    stacks = sys.modules.get(STACKS_MODULE)
    if stacks is not None:
        stacks.register()  # imported by the ranks' sitecustomize as the process started
    else:
        program.register_stacks()


if __name__ == "__main__":
    main(int(sys.argv[1]))
