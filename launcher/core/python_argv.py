"""Where a ``python ...`` command line keeps its interpreter options, its program and the program's
arguments, as CPython's own option parser reads them. Pure.

The launcher runs a Python program through a framework's runner by putting the runner between the two:
``python -u train.py --lr 3`` becomes ``python -u <run.py> train.py --lr 3``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

_INTERPRETER = re.compile(r"^python(\d+(\.\d+)*)?$")
_SWITCHES = set("bBdEiIOPqsSuvx")  # options without a value; several may share one dash (-uB)
_WITH_VALUE = set("WX")  # -W arg, -X opt: the rest of the word or the next word
_LONG_WITH_VALUE = {"--check-hash-based-pycs"}


@dataclass(frozen=True)
class PythonCommand:
    interpreter: str
    options: tuple[str, ...]  # the interpreter's own options, as typed
    kind: str  # "script", "module" (-m) or "code" (-c)
    target: str  # the script path, the module name or the code
    args: tuple[str, ...]

    def target_argv(self) -> list[str]:
        flag = {"script": [], "module": ["-m"], "code": ["-c"]}[self.kind]
        if self.kind == "script" and self.target.startswith("-"):
            flag = ["--"]  # `python -- -u` runs a script named -u: keep it a script
        return [*flag, self.target]


def is_interpreter(word: str) -> bool:
    return bool(_INTERPRETER.match(os.path.basename(word)))


def parse(argv: list[str] | tuple[str, ...]) -> PythonCommand | None:
    """The parts of a command that starts a Python program; None for anything else (a shell, a
    binary, ``python -V``, ``python -`` reading stdin, an option this table does not know)."""
    if not argv or not is_interpreter(argv[0]):
        return None
    i, terminator = 1, 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            terminator = i
            i += 1
            break
        if word.startswith("--"):
            name = word.split("=", 1)[0]
            if name not in _LONG_WITH_VALUE:
                return None  # --help, --version and anything newer than this table
            i += 1 if "=" in word else 2
            continue
        if not word.startswith("-") or word == "-":
            break
        j = 1
        while j < len(word):
            letter = word[j]
            if letter in "cm":
                value = word[j + 1 :]
                if value:
                    rest = argv[i + 1 :]
                elif i + 1 < len(argv):
                    value, rest = argv[i + 1], argv[i + 2 :]
                else:
                    return None
                return PythonCommand(
                    argv[0],
                    tuple(argv[1:i]) + ((word[:j],) if j > 1 else ()),
                    "code" if letter == "c" else "module",
                    value,
                    tuple(rest),
                )
            if letter in _WITH_VALUE:
                if j + 1 == len(word):
                    i += 1  # the value is the next word
                break
            if letter not in _SWITCHES:
                return None
            j += 1
        i += 1
    if i >= len(argv) or argv[i] == "-" or i > len(argv):
        return None
    options = argv[1:terminator] if terminator else argv[1:i]  # without the "--" that ended them
    return PythonCommand(argv[0], tuple(options), "script", argv[i], tuple(argv[i + 1 :]))
