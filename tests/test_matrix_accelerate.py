"""The compatibility matrix for accelerate: ``accelerate launch`` under the launcher against the
oldest accelerate supported (1.0.1, over torch 2.4.1: tests/matrix_envs.py) and the newest (the
test venv's). accelerate_read.py calls Accelerate's private ``_validate_launch_command``: these
runs are what its version gate (launcher/core/versions.py) stands on."""

from __future__ import annotations

import pytest
from conftest import Job, clean_env, rank_reports
from matrix_envs import python_fixture
from test_accelerate import TRAIN, assert_one_world

pytestmark = pytest.mark.matrix
python = python_fixture("accelerate")


def local(python: str) -> list[str]:
    return [python, "-m", "launcher", "local", "--nnodes", "2", "--nproc-per-node", "2", "--accelerate", "--"]


def test_two_nodes_train_as_one_world(python, tmp_path, report_dir):
    job = Job([*local(python), "--mixed_precision", "no", TRAIN], clean_env(REPORT_DIR=str(report_dir)), tmp_path)
    assert job.wait(240) == 0, job.stderr
    reports = rank_reports(report_dir)
    assert_one_world(reports, 4)
    assert {r["env"]["ACCELERATE_MIXED_PRECISION"] for r in reports.values()} == {"no"}


def test_a_failing_process_keeps_its_code_on_both_nodes(python, tmp_path, report_dir):
    job = Job([*local(python), TRAIN], clean_env(REPORT_DIR=str(report_dir), FAIL_RANK="1", EXIT_CODE="5"), tmp_path)
    assert job.wait(240) == 5, job.stderr
    assert job.termination()["rootCause"]["rank"] == 1
