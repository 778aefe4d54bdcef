"""The compatibility matrix for XGBoost: each scenario against every xgboost the launcher supports
(tests/matrix_envs.py: a cached virtual environment per version, and this test environment's own).

Each runs ``<that interpreter> -m launcher local --framework xgboost --nnodes 2 -- python ...``
with the checkout on PYTHONPATH and that interpreter first on PATH, so the launcher, its tracker
and its workers all run on that xgboost. The table in docs/compatibility.md is read from the test ids,
``test_<scenario>[xgboost-<version>]``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import matrix_envs
from conftest import Job, clean_env

pytestmark = pytest.mark.matrix

REPO = Path(__file__).resolve().parents[1]
TRAIN = str(REPO / "tests" / "programs" / "xgboost_train.py")
TIMEOUT = 240  # seconds: a few xgboost imports and two small trainings on two busy CPUs
python = matrix_envs.python_fixture("xgboost")


def run(python: str, tmp_path: Path, **extra: str) -> tuple[Job, Path]:
    out = tmp_path / "out"
    out.mkdir()
    env = {k: v for k, v in clean_env().items() if not k.startswith("DMLC_")}
    env["PATH"] = f"{Path(python).parent}:{env.get('PATH', '/usr/bin:/bin')}"  # `python` is that one
    job = Job([python, "-m", "launcher", "local", "--framework", "xgboost", "--nnodes", "2", "--", "python", TRAIN],
              {**env, "OUT_DIR": str(out), **extra}, tmp_path)
    return job, out


def test_two_pods_succeed(python, tmp_path):
    job, out = run(python, tmp_path)
    assert job.wait(TIMEOUT) == 0, job.stderr
    models = {p.name: p.read_bytes() for p in out.glob("model-*.ubj")}
    assert sorted(models) == ["model-0.ubj", "model-1.ubj"] and len(set(models.values())) == 1, "one model"
    seen = {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in out.glob("worker-*.json")}
    assert {task: (r["rank"], r["world"], bool(r["distributed"])) for task, r in seen.items()} == {
        0: (0, 2, True), 1: (1, 2, True)}
    assert job.termination()["exitCode"] == 0
    assert "Traceback" not in job.stderr and " is off: " not in job.stderr, job.stderr


def test_a_failing_process_is_named(python, tmp_path):
    job, _ = run(python, tmp_path, BEHAVIOUR="exit:3", FAIL_TASK="1")
    assert job.wait(TIMEOUT) == 3, job.stderr
    message = job.termination()
    assert (message["exitCode"], message["reason"], message["retryable"]) == (3, "Failed", False), message
    assert message["rootCause"]["rank"] == 1 and message["rootCause"]["exitCode"] == 3, message
    assert message["rootCause"]["node"] == "local-node-0-1", message
    assert message["message"].startswith("XGBoost worker (task 1) on local-node-0-1 exited with code 3"), message
