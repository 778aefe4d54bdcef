"""The launcher lints and type-checks clean: ``ruff check``, ``ruff format --check`` and ``mypy``
over launcher/, from the repository's root with its ruff.toml and mypy.ini, as
.pre-commit-config.yaml runs them.

The tools come from requirements-dev.txt, which the tests' command installs into the test venv:
each runs as ``python -m TOOL`` in this interpreter's environment, so mypy sees the packages the
launcher runs with. A tool that is not installed fails its test, saying so; it is not skipped.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from importlib import metadata

import pytest
from conftest import REPO

# test id: (module run with ``python -m``, its arguments)
CHECKS = {
    "ruff-check": ("ruff", ("check", "launcher")),
    "ruff-format": ("ruff", ("format", "--check", "launcher")),
    "mypy": ("mypy", ()),  # mypy.ini names the files
}


def pinned(distribution: str) -> str | None:
    """The version requirements-dev.txt pins ``distribution`` to."""
    text = (REPO / "requirements-dev.txt").read_text()
    found = re.search(rf"^{re.escape(distribution)}==(\S+)", text, re.MULTILINE | re.IGNORECASE)
    return found[1] if found else None


@pytest.mark.parametrize("check", list(CHECKS))
def test_launcher_is_clean(check: str) -> None:
    module, args = CHECKS[check]
    command = f"python -m {module} {' '.join(args)}".rstrip()
    if importlib.util.find_spec(module) is None:
        pytest.fail(
            f"{module} is not installed in {sys.prefix}: `{sys.executable} -m pip install -r requirements-dev.txt` "
            "(the tests' command installs it)",
            pytrace=False,
        )
    done = subprocess.run(
        [sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True, timeout=240
    )
    versions = f"{module} {metadata.version(module)} installed, requirements-dev.txt pins {pinned(module)}"
    assert done.returncode == 0, (
        f"`{command}` exited {done.returncode} ({versions}):\n{done.stdout}{done.stderr}"
    )
