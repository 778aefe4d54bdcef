"""Bytecode for the test run: each module compiled once, when it is first imported.

This machine sets PYTHONDONTWRITEBYTECODE=1 (as many images do). Under it no process writes a
.pyc, so every launcher, runner and rank the suite starts (thousands) would compile what it
imports from source again (0.08 s of CPU of a launcher's 0.4, ``python -m launcher torch --``,
5 runs each way), and pytest would rewrite the asserts of every test module again in each worker.
The suite's own run writes bytecode as Python does by default: this plugin clears the variable
for pytest and every process it starts. Measured here on 2 cores:

- collecting the suite in one process: 15.1 s before, 8.5 s once pytest's rewritten modules are
  cached (``pytest --collect-only``, each of the 4 workers pays it);
- CI's setup no longer compiles all of .venv up front (``compileall`` on both cores: 39 s, most
  of it for modules no test imports).

The launcher's package is still compiled once before the tests start (by the controller, or the
only process without ``-n``), so the first processes do not all compile it at once.

Nothing written lands in git (``__pycache__/`` is ignored) or in an image (``.dockerignore``).
"""

from __future__ import annotations

import compileall
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False


def pytest_sessionstart(session) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER") is None:  # the controller, or a run without -n
        compileall.compile_dir(str(REPO / "launcher"), quiet=1)
