"""The suite's groups hold under pytest-xdist (tests/parallel.py): the tests that share the machine's
container engine, or scan its processes, run in one worker. A pytest and pytest-xdist that stop
agreeing on where a group is written would spread them over every worker, where they collide (two
pods named alike, one address given twice): the whole suite would pass or fail by chance."""

from __future__ import annotations

import re
import subprocess
import sys

from conftest import REPO, clean_env


def test_a_group_of_the_suite_runs_in_one_worker():
    result = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider",
                             "tests/test_smoke_checks.py"], cwd=REPO, capture_output=True, text=True, timeout=300,
                            env=clean_env())
    assert result.returncode == 0, result.stdout[-3000:]
    ran = re.findall(r"\[(gw\d+)\].* PASSED (\S+)", result.stdout)
    assert len(ran) >= 5, result.stdout[-3000:]
    assert all(test.endswith("@smoke") for _, test in ran), result.stdout[-3000:]
    assert len({worker for worker, _ in ran}) == 1, result.stdout[-3000:]
