"""The launcher's bytecode, compiled once before the tests start.

This machine sets PYTHONDONTWRITEBYTECODE=1 (as many images do), so no process writes a .pyc: every
launcher, runner and rank the suite starts (thousands) would compile the package from source
again, 0.08 s of CPU each of a launcher's 0.4 (``python -m launcher torch --``, 5 runs each way).
compileall writes them whatever the variable says; the processes only read them.
"""

from __future__ import annotations

import compileall
import os

from conftest import REPO


def pytest_sessionstart(session) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER") is None:  # the controller, or a run without -n
        compileall.compile_dir(str(REPO / "launcher"), quiet=1)
