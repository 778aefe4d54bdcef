"""A launcher process's end, without the interpreter's teardown of every module it loaded."""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from typing import NoReturn


def exit_now(code: int) -> NoReturn:
    """Exit with ``code`` at once: the interpreter's teardown frees every module one by one (with
    pydantic loaded, about 0.1 s, in series after the outcome is delivered, for nothing). The exit
    handlers registered still run and the standard streams are flushed; where a thread other than
    a daemon is still alive, the interpreter's usual exit runs instead, and waits for it."""
    main_thread = threading.main_thread()
    if any(not thread.daemon for thread in threading.enumerate() if thread is not main_thread):
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed, or its reader is gone
            stream.flush()
    os._exit(code)
