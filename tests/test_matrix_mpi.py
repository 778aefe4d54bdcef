"""The compatibility matrix for mpi4py on Open MPI 5: 3.1 (built from source against the MPI's
headers, tests/matrix_envs.py) and 4.1 (the binary wheel in the test venv), each the launcher's
and the ranks' interpreter, over real sshd between two emulated pods."""

from __future__ import annotations

import os

import pytest

from conftest import Job, clean_env, launcher
from matrix_envs import python_fixture
from test_mpi import IMPLEMENTATIONS, PROGRAM, _missing, needs_cluster, reports, shared_dir  # noqa: F401

pytestmark = [pytest.mark.matrix, needs_cluster]
python = python_fixture("mpi4py")
MPIRUN, LIBMPI = IMPLEMENTATIONS["openmpi5"][1], IMPLEMENTATIONS["openmpi5"][2]


@pytest.fixture(autouse=True)
def openmpi5():
    if reason := _missing("openmpi5"):
        pytest.skip(reason)


def local_mpi(python: str, tmp_path, shared_dir, **env) -> Job:
    argv = [python, *launcher("local", "--mpi", "openmpi", "--nnodes", "2", "--nproc-per-node", "1",
                              "--mpirun", MPIRUN, "--grace-period", "3", "--", PROGRAM)[1:]]
    environment = clean_env(MPI4PY_LIBMPI=LIBMPI, PATH=f"{os.path.dirname(MPIRUN)}:{os.environ['PATH']}",
                            REPORT_DIR=str(shared_dir), **env)
    return Job(argv, environment, tmp_path)


def test_two_pods_succeed(python, tmp_path, shared_dir):
    job = local_mpi(python, tmp_path, shared_dir)
    assert job.wait(180) == 0, job.stderr
    ranks = reports(shared_dir)
    assert sorted(ranks) == [0, 1]
    assert {r["hostname"] for r in ranks.values()} == {"local-node-0-0", "local-node-0-1"}
    assert {r["allreduce"] for r in ranks.values()} == {1 + 2}


def test_a_failing_process_is_named(python, tmp_path, shared_dir):
    job = local_mpi(python, tmp_path, shared_dir, BEHAVIOUR="exit:3", FAIL_RANK="1")
    assert job.wait(120) == 3, job.stderr
    message = job.termination()
    assert message["retryable"] is False
    assert message["rootCause"]["rank"] == 1 and message["rootCause"]["node"].startswith("local-node-0-1")
