"""The documentation site builds: ``python -m mkdocs build --strict`` from the checkout, as a
subprocess (integration tier). mkdocs.yml makes strict fail on a page missing from the nav, a link
to a page or an anchor that does not exist, and a page the nav names but docs/ lacks.

mkdocs-material comes from requirements-docs.txt, which the test command installs (through
requirements-dev.txt): without it the test fails, saying what to install.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

from conftest import REPO


def test_the_site_builds_with_strict_checks(tmp_path):
    assert importlib.util.find_spec("mkdocs") and importlib.util.find_spec("material"), (
        "mkdocs-material is not installed here: pip install -r requirements-docs.txt")
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's notice about its successor, not a warning of ours
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    for page in ("index.html", "reference/exit-codes/index.html", "reference/knobs/index.html",
                 "reference/cli/index.html", "getting-started/index.html"):
        assert (site / page).is_file(), page
