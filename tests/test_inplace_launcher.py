"""The launcher as JobSet's in-place restart agent, end to end: a real `trainer-launcher torch`
pod against the stand-in of the Kubernetes API server in tests/jobset_server.py (no API server
can run here; the stand-in serves exactly what the agent asks, written from JobSet v0.12.0).
The job's processes start only once the barrier is down; when the JobSet asks every pod to
restart in place, the pod stops them and exits with IN_PLACE_RESTART_EXIT_CODE, the code its
container's restart rules restart it on."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from conftest import IS_ROOT, Job, clean_env, free_port, launcher, wait_for
from jobset_server import ATTEMPT
from test_inplace import ME, OTHER, account, env_for, server  # noqa: F401 - the fixtures

PROGRAM = """
import os, sys, time
print("the program started", file=sys.stderr, flush=True)
with open(sys.argv[1] + ".tmp", "w") as handle:
    handle.write(str(os.getpid()))
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
while True:
    time.sleep(60)
"""


def _pod(framework: str, program: Path, started: Path) -> tuple[list[str], dict[str, str]]:
    """One pod of a one-pod job of ``framework``, as Trainer starts it: its command and variables."""
    if framework == "torch":
        return ["--", "--standalone", str(program), str(started)], {"PET_NPROC_PER_NODE": "1"}
    if framework == "jax":
        return ["--", sys.executable, str(program), str(started)], {
            "JAX_NUM_PROCESSES": "1", "JAX_PROCESS_ID": "0", "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{free_port()}"}
    return ["--", sys.executable, str(program), str(started)], {
        "DMLC_TRACKER_URI": "127.0.0.1", "DMLC_TRACKER_PORT": str(free_port()), "DMLC_TASK_ID": "0",
        "DMLC_NUM_WORKER": "1"}


@pytest.mark.parametrize("framework", ["torch", "jax", "xgboost"])
def test_the_job_waits_for_the_barrier_and_stops_when_the_jobset_asks_every_pod_to_restart(
    tmp_path: Path, server, account, framework  # noqa: F811
):
    program, started = tmp_path / "train.py", tmp_path / "started"
    program.write_text(PROGRAM)
    command, variables = _pod(framework, program, started)
    env = {k: v for k, v in clean_env(**env_for(server, account)).items() if not k.startswith(("JAX_", "DMLC_"))}
    pod = Job(launcher(framework, "--grace-period", "5", *command), {**env, **variables}, tmp_path)
    # The pod announced attempt 0 and holds the job until every pod is there.
    server.wait_for(lambda: server.annotations(ME).get(ATTEMPT) == "0" and server.watching or pod.process.poll(),
                    what="the announcement")
    assert pod.process.poll() is None, pod.stderr[-3000:]
    server.annotate(OTHER, 0)
    wait_for(lambda: started.exists() or pod.process.poll() is not None, 120, "the job to start once the barrier is down")
    assert started.exists(), pod.stderr[-3000:]
    # The other pod failed and came back at attempt 1: every pod must restart its container.
    server.annotate(OTHER, 1)
    assert pod.wait(120) == 138, pod.stderr[-3000:]
    message = pod.termination()
    assert (message["reason"], message["retryable"]) == ("RestartAsked", True), message
    said = pod.stderr
    assert "the JobSet asks every pod to restart in place" in said
    # Nothing started while the barrier stood: the program's first word comes after it fell.
    assert said.index("waiting for the JobSet's other pods") < said.index("barrier down at attempt 0") < said.index(
        "the program started"), said


@pytest.mark.skipif(not IS_ROOT or not shutil.which("sshd"), reason="needs root and sshd")
def test_an_mpi_worker_takes_part_in_the_barrier_and_restarts_when_asked(
    tmp_path: Path, server, account  # noqa: F811
):
    """The MPI worker role is a pod of the JobSet too: it announces its attempt, so the barrier of
    mpirun's pod can fall, and restarts its container when the JobSet asks. Its sshd serves from
    the start: it runs nothing of the job's, mpirun's pod does once its own barrier is down."""
    from test_mpi import serving, worker_role

    with worker_role(tmp_path, "root", **env_for(server, account)) as (worker, _, _):
        assert serving(worker), worker.stderr
        server.wait_for(lambda: server.annotations(ME).get(ATTEMPT) == "0" and server.watching,
                        what="the announcement")
        server.annotate(OTHER, 0)
        wait_for(lambda: "barrier down at attempt 0" in worker.stderr, 60, "the barrier to fall")
        server.annotate(OTHER, 1)
        assert worker.wait(120) == 138, worker.stderr[-3000:]
        assert "the JobSet asks every pod to restart in place" in worker.stderr
