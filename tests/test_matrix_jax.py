"""The compatibility matrix for JAX: each scenario against every jax the launcher supports
(tests/matrix_envs.py: a cached virtual environment per version, and this test environment's own).

Each runs ``<that interpreter> -m launcher local --framework jax --nnodes 2 -- <that interpreter> ...``
with the checkout on PYTHONPATH: the launcher, its runner and the program all run on that jax, on
CPU, a real ``jax.distributed`` job of two processes. The table in docs/compatibility.md is read from
the test ids, ``test_<scenario>[jax-<version>]``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import matrix_envs
from conftest import Job, clean_env

pytestmark = pytest.mark.matrix

REPO = Path(__file__).resolve().parents[1]
WORLD = str(REPO / "tests" / "programs" / "jax_world.py")
FAIL = str(REPO / "tests" / "programs" / "jax_fail.py")
TIMEOUT = 240  # seconds: two JAX imports on two busy CPUs
python = matrix_envs.python_fixture("jax")


def run(python: str, tmp_path: Path, program: str, **extra: str) -> Job:
    env = {k: v for k, v in clean_env().items() if not k.startswith("JAX_")}
    return Job([python, "-m", "launcher", "local", "--framework", "jax", "--nnodes", "2", "--", python, program],
               {**env, **extra}, tmp_path)


def test_two_pods_succeed(python, tmp_path):
    job = run(python, tmp_path, WORLD)
    assert job.wait(TIMEOUT) == 0, job.stderr
    for index in range(2):
        assert f"[node-{index}] process {index} of 2: allgather sum 3, psum over 2 devices 2" in job.stdout, job.stdout
    assert job.termination()["exitCode"] == 0
    assert "Traceback" not in job.stderr and " is off: " not in job.stderr, job.stderr


def test_a_failing_process_is_named(python, tmp_path):
    job = run(python, tmp_path, FAIL, FAIL_ID="1", FAIL_CODE="3")
    assert job.wait(TIMEOUT) == 3, job.stderr
    message = job.termination()
    assert (message["exitCode"], message["reason"], message["retryable"]) == (3, "Failed", False), message
    assert message["rootCause"]["rank"] == 1 and message["rootCause"]["exitCode"] == 3, message
    assert message["rootCause"]["node"] == "local-node-0-1", message
    assert message["message"].startswith("JAX process 1 on local-node-0-1 exited with code 3"), message
