"""The user's program, run inside the user's interpreter exactly as ``python`` would run it, and the
few things every runner of the launcher does in that process around it.

The launcher puts a runner between the interpreter and the program (``python -u <runner>
train.py --lr 3``): each framework's ``run.py`` and the rank wrapper. They all run the program
through this file, so a program ends the same under any of them as under ``python`` itself:

- what to run: ``[--] SCRIPT | -m MODULE | -c CODE | - [ARGS...]`` (:func:`parse_target`), as
  ``launcher/core/python_argv.py`` writes it after the runner;
- ``sys.path[0]`` as python sets it for the program, not the runner's folder, whose
  ``settings.py`` and ``plan.py`` would shadow the program's own modules (:func:`set_sys_path`);
- the program runs as ``__main__`` in a real module, ``sys.argv`` as python sets it
  (``[script, ...]``, ``['-c', ...]``, ``[module file, ...]``), and it ends as python ends it
  (:func:`run_program`): ``sys.exit(n)`` is ``n & 0xFF``, ``sys.exit("text")`` prints the text and
  is 1, an exception goes through ``sys.excepthook`` without this file's and runpy's frames and is
  1, a KeyboardInterrupt kills the process with SIGINT after the exit handlers, as python does
  (130 to a shell). A script that cannot be opened and a module that cannot be found are python's
  one line, exit 2 and 1;
- around it: siblings loaded by path (:func:`load_sibling`; the report to the launcher is
  report.py's, :func:`records`), leaving at once without exit handlers (:func:`leave`), the stack
  dump registered late (:func:`register_stacks`).

``python program.py [--] SCRIPT|-m MODULE|-c CODE|- [ARGS...]`` runs a program through it alone:
the thin runner the tests hold side by side with python.

Stdlib only, Python 3.10 syntax and library, and loaded by path under a private name (never as
``launcher.runner``): the user's interpreter may not have the launcher importable.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import importlib.machinery
import importlib.util
import io
import os
import runpy
import signal
import sys
import types
from typing import NamedTuple, NoReturn

USAGE = "[--] SCRIPT | -m MODULE | -c CODE | - [ARGS...]"
ERROR_LIMIT = 1000  # characters of an error in a report
INTERRUPTED = 128 + signal.SIGINT  # what a shell shows for a program that python killed with SIGINT
_HERE = os.path.realpath(__file__)
_RUNPY = os.path.realpath(runpy.__file__)
_LONG = 2**63  # sys.exit(n) goes through a C long: python exits 255 for an n outside it
STACKS_HOOK = os.path.join("hook", "_trainer_launcher_stacks.py")


# --- the launcher's other files -------------------------------------------------------------------


def load_sibling(anchor: str, relative: str, name: str) -> types.ModuleType:
    """The stdlib-only launcher file at ``relative`` to the folder of ``anchor`` (the caller's
    ``__file__``), loaded by path under ``name``: never a name the program's own modules could
    have. Loaded once: a second call, or a module already there under ``name``, returns it."""
    if name in sys.modules:
        return sys.modules[name]
    path = os.path.join(os.path.dirname(os.path.abspath(anchor)), relative)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path} as {name}", name=name, path=path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while it executes
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def core(name: str) -> types.ModuleType:
    """The launcher's stdlib-only ``core/<name>.py`` (crash, versions, reasons), loaded by path
    under ``_trainer_launcher_<name>``."""
    return load_sibling(__file__, os.path.join(os.pardir, "core", f"{name}.py"), f"_trainer_launcher_{name}")


def records() -> types.ModuleType:
    """The launcher's report and stop record (report.py beside this file), loaded by path under
    ``_trainer_launcher_report``."""
    return load_sibling(__file__, "report.py", "_trainer_launcher_report")


def register_stacks() -> None:
    """With hang detection on, register this process's stack dump now: the launcher's variables
    reached a runner after it started, too late for the hook the launcher puts on PYTHONPATH.
    The hook registers on import, once per process, and never raises."""
    if os.environ.get("LAUNCHER_STACKS_DIR"):
        load_sibling(__file__, STACKS_HOOK, "_trainer_launcher_stacks")


# --- what to run ----------------------------------------------------------------------------------


def parse_target(argv: list[str]) -> tuple[str, str, list[str]]:
    """What follows a runner's own options, as ``PythonCommand.target_argv``
    (launcher/core/python_argv.py) writes it: (kind, target, args), kind ``script``, ``module``
    (-m), ``code`` (-c) or ``stdin`` (-). ``--`` first, as after python's own options, makes the
    next word a script even if it is ``-m``. A usage error is a ValueError, its text one line."""
    script_only = argv[:1] == ["--"]
    if script_only:
        argv = argv[1:]
    if not argv:
        raise ValueError(f"nothing to run: expected {USAGE}")
    first = argv[0]
    if first == "-":  # python reads the program from stdin, after "--" too
        return "stdin", first, argv[1:]
    if script_only:
        return "script", first, argv[1:]
    for flag, kind in (("-m", "module"), ("-c", "code")):
        if first == flag:
            if len(argv) < 2:
                raise ValueError(f"{flag} needs a value: expected {USAGE}")
            return kind, argv[1], argv[2:]
        if first.startswith(flag):
            return kind, first[2:], argv[1:]
    return "script", first, argv[1:]


def set_sys_path(kind: str, target: str, entry: str) -> None:
    """Put first on sys.path what python puts there for the program, in place of ``entry``, what
    it put there for the runner (the runner's folder, or the working directory under ``-m``)."""
    if sys.flags.isolated or getattr(sys.flags, "safe_path", False):
        return  # -I, -P: python puts nothing there, for the runner or the program
    if kind == "script":
        first = os.path.dirname(os.path.realpath(target))
    elif kind == "module":
        first = os.getcwd()
    else:
        first = ""
    if sys.path and os.path.realpath(sys.path[0] or os.curdir) == os.path.realpath(entry):
        sys.path[0] = first
    else:
        sys.path.insert(0, first)


# --- running it -----------------------------------------------------------------------------------


class Ending(NamedTuple):
    """How the program ended: the status python would exit with and what ended it."""

    status: int  # 0-255; INTERRUPTED for a KeyboardInterrupt
    error: BaseException | None = None  # what it raised, SystemExit included, when status is not 0
    interrupted: bool = False  # a KeyboardInterrupt: python would die of SIGINT


def run_program(kind: str, target: str, args: list[str]) -> Ending:
    """Run the program as ``__main__`` and say how it ended; what python prints at the end
    (a traceback, a sys.exit message, why it could not start) is printed here the same way."""
    _arm_interrupted_exit()
    try:
        if kind == "script":
            _run_file(target, args)
        elif kind == "module":
            sys.argv = [target, *args]  # run_module puts the module's file here, as python does
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        elif kind == "code":
            sys.argv = ["-c", *args]
            _run_as_main(
                compile(target, "<string>", "exec", dont_inherit=True),
                {"__loader__": importlib.machinery.BuiltinImporter},
            )
        else:
            sys.argv = ["-", *args]
            _run_as_main(
                compile(sys.stdin.read(), "<stdin>", "exec", dont_inherit=True),
                {"__loader__": importlib.machinery.BuiltinImporter},
            )
    except SystemExit as exit_:
        status = exit_status(exit_.code)
        if exit_.code is not None and not isinstance(exit_.code, int):
            _print_to_stderr(exit_.code)
        return Ending(status, exit_ if status else None)
    except BaseException as error:  # noqa: BLE001 - the program's end, reported as python would
        return _ended_by(kind, target, error)
    return Ending(0)


def _run_file(path: str, args: list[str]) -> None:
    """A script as python runs it: ``sys.argv[0]`` as given, ``__file__`` absolute, the source
    compiled without this file's ``from __future__`` flags. A folder or zip file with a
    ``__main__.py``, or compiled bytecode, goes through runpy."""
    sys.argv = [path, *args]
    if os.path.isdir(path) or path.endswith((".pyc", ".pyo")) or _is_zip(path):
        runpy.run_path(path, run_name="__main__")
        return
    filename = path if os.path.isabs(path) else os.path.join(os.getcwd(), path)  # not normalized: python's
    with io.open_code(filename) as handle:
        source = handle.read()
    code = compile(source, filename, "exec", dont_inherit=True)
    _run_as_main(
        code,
        {
            "__file__": filename,
            "__cached__": None,
            "__loader__": importlib.machinery.SourceFileLoader("__main__", filename),
        },
    )


def _is_zip(path: str) -> bool:
    import zipfile

    try:
        return zipfile.is_zipfile(path)
    except OSError:
        return False


def _run_as_main(code: types.CodeType, attributes: dict) -> None:
    """Run ``code`` in a new ``__main__`` module, left in sys.modules afterwards as python leaves
    its own: pickle and the program's threads find the program's names there."""
    main = types.ModuleType("__main__")
    main.__dict__.update({"__builtins__": builtins, **attributes})
    sys.modules["__main__"] = main
    exec(code, main.__dict__)


def _ended_by(kind: str, target: str, error: BaseException) -> Ending:
    frames = _program_frames(error.__traceback__)
    if frames is None and kind == "script" and isinstance(error, OSError):
        # python's own words for a script it cannot open, and its exit status 2
        program = (getattr(sys, "orig_argv", None) or [sys.executable])[0]
        filename = target if os.path.isabs(target) else os.path.join(os.getcwd(), target)
        _print_to_stderr(f"{program}: can't open file '{filename}': [Errno {error.errno}] {error.strerror}")
        return Ending(2, error)
    if frames is None and isinstance(error, ImportError) and kind in ("module", "script"):
        # runpy found no module, or no __main__ in a folder: python says so in one line, exit 1
        _print_to_stderr(f"{sys.executable}: {error}")
        return Ending(1, error)
    error = error.with_traceback(frames)  # a hook may print the exception's own traceback
    try:
        sys.excepthook(type(error), error, frames)
    except Exception:  # noqa: BLE001 - a broken hook: python falls back to its own printing
        sys.__excepthook__(type(error), error, frames)
    if isinstance(error, KeyboardInterrupt):
        return Ending(INTERRUPTED, error, interrupted=True)
    return Ending(1, error)


def _program_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """The traceback from the program's first frame on: this file's and runpy's say nothing to
    the user. None when the error never reached the program (a compile error, a missing file)."""
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if not (filename.startswith("<frozen runpy") or os.path.realpath(filename) in (_HERE, _RUNPY)):
            break
        tb = tb.tb_next
    return tb


def exit_status(code: object) -> int:
    """What python exits with for ``SystemExit(code)``: None 0, an integer its low byte (through
    a C long), anything else 1 (python prints it)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF if -_LONG <= code < _LONG else 255
    return 1


def describe(error: BaseException | None) -> str | None:
    """What ended the program, in one line for a report: ``Type: message``, the text of
    ``sys.exit("text")``, None for a plain exit status."""
    if error is None:
        return None
    if isinstance(error, SystemExit):
        if error.code is None or isinstance(error.code, int):
            return None
        text = str(error.code)
    else:
        text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    return " ".join(line.strip() for line in text.splitlines() if line.strip())[:ERROR_LIMIT]


def _print_to_stderr(what: object) -> None:
    with contextlib.suppress(Exception):  # no stderr left: python would say nothing either
        print(what, file=sys.stderr, flush=True)


# --- leaving --------------------------------------------------------------------------------------


def leave(status: int, interrupted: bool = False) -> NoReturn:
    """Exit now, without exit handlers (a collective's shutdown would wait for peers that are not
    coming), after flushing what the program printed. ``interrupted``: die of SIGINT, as python
    does after a KeyboardInterrupt."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, OSError, ValueError):
            stream.flush()
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(INTERRUPTED if interrupted else status)


def exit_as_python(ending: Ending) -> NoReturn:
    """Exit as python would after the program: exit handlers first, then the status, or SIGINT."""
    if ending.interrupted:
        _die_of_sigint.append(True)
    sys.exit(ending.status)


_die_of_sigint: list[bool] = []


def _interrupted_exit() -> None:
    if _die_of_sigint:
        leave(INTERRUPTED, interrupted=True)


def _arm_interrupted_exit() -> None:
    """Register the SIGINT death before the program registers its own exit handlers: they run
    last first, so it comes after all of theirs, as python's does."""
    atexit.unregister(_interrupted_exit)
    atexit.register(_interrupted_exit)


def main(argv: list[str]) -> None:
    try:
        kind, target, args = parse_target(argv)
    except ValueError as usage:
        _print_to_stderr(f"trainer-launcher: error: {usage}")
        sys.exit(2)
    set_sys_path(kind, target, os.path.dirname(_HERE))
    exit_as_python(run_program(kind, target, args))


if __name__ == "__main__":
    main(sys.argv[1:])
