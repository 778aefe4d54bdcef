"""The launcher's own crash, told apart from the program's failure.

An exception whose innermost frame is the launcher's code (a hook of ours that broke, not the
framework's call it wraps, nor the user's program) is the launcher's bug: exit
:data:`INTERNAL_ERROR`, reason :data:`REASON`, with the frame it came from
(launcher.core.outcome.internal_error builds the outcome).

Stdlib only, and loadable by path: the frameworks' runners, in the user's interpreter, use it.
"""

from __future__ import annotations

import os
import sys
import traceback

if __package__:
    from launcher.core.reasons import Reasons
else:  # loaded by path in the user's interpreter (the runners): the table is our sibling

    def _sibling_reasons():
        import importlib.util

        name = "_trainer_launcher_reasons"  # the name the runners load it under too: one copy
        if name not in sys.modules:
            path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reasons.py")
            spec = importlib.util.spec_from_file_location(name, path)
            if spec is None or spec.loader is None:
                raise ImportError(f"cannot load the table of reasons from {path}", path=path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            sys.modules[name] = module
        return sys.modules[name].Reasons

    Reasons = _sibling_reasons()  # type: ignore[misc]  # the same class, loaded by path

# The table's row for the launcher's own failure (why 70, and permanent: launcher.core.reasons).
REASON = Reasons.LAUNCHER_ERROR
INTERNAL_ERROR = REASON.code
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _ours(filename: str) -> bool:
    return os.path.abspath(filename).startswith(_PACKAGE + os.sep)


def raised_in_launcher(error: BaseException) -> bool:
    """Whether ``error`` was raised by the launcher's own code."""
    frames = traceback.extract_tb(error.__traceback__)
    return bool(frames) and _ours(frames[-1].filename)


def crash_site(error: BaseException) -> str | None:
    """The innermost frame of ``error`` inside the launcher (else the innermost at all), as
    ``launcher/<framework>/agent.py:40 in _track_workers``."""
    frames = traceback.extract_tb(error.__traceback__)
    candidates = [f for f in frames if _ours(f.filename)] or frames
    if not candidates:
        return None
    frame = candidates[-1]
    shown = (
        os.path.relpath(os.path.abspath(frame.filename), os.path.dirname(_PACKAGE))
        if _ours(frame.filename)
        else frame.filename
    )
    return f"{shown}:{frame.lineno} in {frame.name}"


def describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"[:1000]
