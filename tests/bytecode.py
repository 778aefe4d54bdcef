"""Bytecode for the test run, compiled up front with every core.

This machine sets PYTHONDONTWRITEBYTECODE=1 (as many images do), so no process writes a .pyc: every
launcher, runner and rank the suite starts (thousands) would compile from source again, 0.08 s of
CPU each of a launcher's 0.4 (``python -m launcher torch --``, 5 runs each way). compileall writes
them whatever the variable says; the processes only read them.

- ``python -m tests.bytecode DIR...``: the test environment once its packages are in, without
  bytecode (tests/install.py, the README's test command, calls it). pip compiles one file at a
  time: 68 s for .venv here, against 39 s on both cores. A file written for another Python
  (torch ships one for 3.12) is left as source, as pip leaves it. Compiling lazily instead (each
  process writing what it imports) was slower: the ranks that run as another user (MPI over
  sshd: DeepSpeed, torch) cannot write into .venv and compiled torch from source every time
  (CI: 18.5 min against 15).
- As a pytest plugin: the launcher's package, once, before the tests start; and pytest's own
  process writes its bytecode, so the test modules' rewritten asserts are cached instead of being
  rewritten again in every worker (collecting the suite: 15.1 s before, 8.5 s after, each of the
  4 workers). The processes the tests start keep the machine's setting.
"""

from __future__ import annotations

import compileall
import os
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# What no process of the suite imports, left as source: the packages' own test suites, the
# transformers model zoo (thousands of modules: Trainer loads only models/auto, and Accelerate,
# DeepSpeed and torchtune none) and pip. A quarter of .venv's files: 8 s of the step's 30.
NEVER_IMPORTED = re.compile(r"/(?:tests?|testing/_internal)/|/site-packages/(?:transformers/models/(?!auto/)[^/]+/|pip/)")


def pytest_configure(config) -> None:
    sys.dont_write_bytecode = False  # for pytest's assertion rewriting cache; os.environ is untouched


def pytest_sessionstart(session) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER") is None:  # the controller, or a run without -n
        compileall.compile_dir(str(REPO / "launcher"), quiet=1)


def main(directories: list[str]) -> int:
    for directory in directories:
        compileall.compile_dir(directory, quiet=2, workers=0, rx=NEVER_IMPORTED)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
