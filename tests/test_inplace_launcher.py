"""The launcher as JobSet's in-place restart agent, end to end: a real `trainer-launcher torch`
pod against the stand-in of the Kubernetes API server in tests/jobset_server.py (no API server
can run here; the stand-in serves exactly what the agent asks, written from JobSet v0.12.0).
The job's processes start only once the barrier is down; when the JobSet asks every pod to
restart in place, the pod stops them and exits with IN_PLACE_RESTART_EXIT_CODE, the code its
container's restart rules restart it on."""

from __future__ import annotations

from pathlib import Path

from conftest import Job, clean_env, launcher, wait_for
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


def test_the_job_waits_for_the_barrier_and_stops_when_the_jobset_asks_every_pod_to_restart(
    tmp_path: Path, server, account  # noqa: F811
):
    program, started = tmp_path / "train.py", tmp_path / "started"
    program.write_text(PROGRAM)
    env = clean_env(**env_for(server, account), PET_NPROC_PER_NODE="1")
    pod = Job(launcher("torch", "--grace-period", "5", "--", "--standalone", str(program), str(started)), env,
              tmp_path)
    # The pod announced attempt 0 and holds the job until every pod is there.
    server.wait_for(lambda: server.annotations(ME).get(ATTEMPT) == "0" and server.watching, what="the announcement")
    server.annotate(OTHER, 0)
    wait_for(started.exists, 120, "the job to start once the barrier is down")
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
