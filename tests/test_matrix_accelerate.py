"""The compatibility matrix for accelerate: ``accelerate launch`` under ``local`` against the
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
    assert [reports[i]["local"] for i in range(4)] == [0, 1, 0, 1]  # node 0 holds processes 0 and 1
    assert {r["env"]["ACCELERATE_MIXED_PRECISION"] for r in reports.values()} == {"no"}


def test_a_failing_process_keeps_its_code_on_both_nodes(python, tmp_path, report_dir):
    """Process 3 exits 3 while the others wait in DDP's all-reduce (their gloo pairs print
    "Connection closed by peer"): both nodes say exit 3 and name process 3 on node 1."""
    job = Job([*local(python), TRAIN], clean_env(REPORT_DIR=str(report_dir), FAIL_RANK="3", EXIT_CODE="3"), tmp_path)
    assert job.wait(240) == 3, job.stderr
    message = job.termination()
    assert message["rootCause"]["rank"] == 3 and message["rootCause"]["node"] == "local-node-0-1", message
    assert message["retryable"] is False
    for node in ("[node-0]", "[node-1]"):
        verdicts = [line for line in job.stderr.splitlines() if line.startswith(node) and "-> exit 3" in line]
        assert verdicts and "rank 3" in verdicts[-1], (node, job.stderr)
