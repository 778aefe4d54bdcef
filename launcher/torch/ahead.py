"""Ranks started ahead, in the torch agent of a job's next generation (a restart in place).

The agent of generation g+1 is started while generation g trains (launcher.torch.job). Once it has
imported torch it starts one standby rank per local rank (launcher/torch/standby.py): each imports
torch too, and waits. When torchrun starts the generation's ranks, :meth:`RanksAhead.take` hands
each command to a standby rank and gives torchrun that process's Popen in place of a new one, so a
restart pays neither the interpreter's start nor ``import torch`` in its ranks. What torchrun
would have started otherwise (a command that is not ``python -u ...``, output to something other
than a file) starts as usual.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Callable

STANDBY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "standby.py")


class RanksAhead:
    def __init__(self) -> None:
        self.waiting: list[tuple[subprocess.Popen, int]] = []  # (the rank, the write end of its pipe)

    def start(self, count: int, env: dict[str, str], in_child: Callable[[], None]) -> None:
        """``count`` standby ranks, with the environment the ranks will have but their own
        variables (the agent's interpreter is the launcher's: launcher/runner/ runs there)."""
        for _ in range(count):
            read, write = os.pipe()
            try:
                process = subprocess.Popen(
                    [sys.executable, "-u", STANDBY, str(read)],
                    env=env,
                    pass_fds=(read,),
                    start_new_session=True,  # as torchrun starts its ranks: each its own group
                    preexec_fn=in_child,  # PR_SET_PDEATHSIG, before the exec
                )
            except OSError:
                os.close(write)
                return
            finally:
                os.close(read)
            self.waiting.append((process, write))

    def take(self, args, kwargs: dict) -> subprocess.Popen | None:
        """A standby rank running the command torchrun gave Popen, or None: start it as usual."""
        command = list(kwargs.get("args", args[0] if args else ()))
        env = kwargs.get("env")
        if len(command) < 3 or command[0] != sys.executable or command[1] != "-u" or env is None:
            return None
        outputs = [_path(kwargs.get(name)) for name in ("stdout", "stderr")]
        if any(path is False for path in outputs) or kwargs.get("cwd") not in (None, os.getcwd()):
            return None
        while self.waiting:
            process, write = self.waiting.pop(0)
            request = {"argv": command[2:], "env": dict(env), "stdout": outputs[0], "stderr": outputs[1]}
            try:
                if process.poll() is not None:
                    continue
                os.write(write, json.dumps(request).encode() + b"\n")
                return process
            except OSError:
                continue
            finally:
                os.close(write)
        return None

    def close(self) -> None:
        """The ranks no command went to leave quietly (their pipe ends unsaid)."""
        for _, write in self.waiting:
            with contextlib.suppress(OSError):
                os.close(write)
        self.waiting.clear()


def _path(output) -> str | bool | None:
    """Where Popen was told to write: a file's path, None (inherited: the standby has it too), or
    False for anything else (a pipe, a descriptor), which a standby rank cannot take over."""
    if output is None:
        return None
    name = getattr(output, "name", None)
    return name if isinstance(name, str) and os.path.isfile(name) else False
