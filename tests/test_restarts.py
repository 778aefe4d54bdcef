"""Restarts in place (issue 37): a retryable fault restarts every pod's ranks in the same
containers, from the job's last checkpoint, instead of ending the job.

Real launchers, torchrun agents and gloo ranks: two pods of two ranks as Trainer starts them (a
static rendezvous on the master's port, or the user's c10d), each its own `trainer-launcher torch`.
The program (tests/programs/resume.py) checkpoints every step and resumes from the checkpoint, as
the elastic examples do; its weights count the steps done, so a step lost or done twice fails it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import REPO, Job, clean_env, free_port, launcher, wait_for

# Each test runs two or three starts of a four-rank job; under two CPU burners on two cores, one
# start alone can take a minute.
pytestmark = pytest.mark.timeout(900)
RESUME = str(REPO / "tests" / "programs" / "resume.py")
STEPS = 10


def _pods(tmp_path: Path, report_dir: Path, restarts: str, backend: str = "static", *, port: int | None = None,
          nodes: tuple[int, ...] = (1, 0), options: tuple[str, ...] = (), **env: str) -> list[Job]:
    """Two pods, the worker first. ``restarts``: how the user asks for them, torchrun's way or ours.
    ``port``, ``nodes``: the job's master port, and which of its pods to start (a replacement)."""
    port = port or free_port()
    spelled = {
        "torchrun": (("--max-restarts", "2"), (), {}),
        "pet": ((), (), {"PET_MAX_RESTARTS": "2"}),
        "launcher": ((), ("--max-restarts", "2"), {}),
        "env": ((), (), {"LAUNCHER_MAX_RESTARTS": "2"}),
        "none": ((), (), {}),
    }
    torchrun, ours, variables = spelled[restarts]
    rendezvous = {"PET_RDZV_BACKEND": "c10d"} if backend == "c10d" else {}
    pods = []
    env = {"STEPS": str(STEPS), **env}
    for node in nodes:
        pod_env = clean_env(
            PET_NNODES="2", PET_NPROC_PER_NODE="2", PET_NODE_RANK=str(node), PET_MASTER_ADDR="127.0.0.1",
            PET_MASTER_PORT=str(port), HOSTNAME=f"job-node-0-{node}", CKPT=str(tmp_path / "checkpoint.pt"),
            REPORT_DIR=str(report_dir), **rendezvous, **{**variables, **env},
        )
        argv = launcher("torch", "--grace-period", "5", *ours, *options, "--", *torchrun, RESUME)
        pods.append(Job(argv, pod_env, tmp_path, f"node{node}-{len(list(tmp_path.glob(f'node{node}*.out')))}"))
    return pods


def _steps(report_dir: Path, rank: int) -> list[tuple[int, int, str]]:
    """(generation as torch told the rank, step, the launcher's restart count) per step done."""
    lines = (report_dir / f"{rank}.steps").read_text().split()
    return [(int(lines[i]), int(lines[i + 1]), lines[i + 2]) for i in range(0, len(lines), 3)]


@pytest.mark.parametrize(
    "backend, restarts", [("static", "torchrun"), ("static", "launcher"), ("c10d", "pet"), ("c10d", "env")]
)
def test_a_rank_killed_once_resumes_from_the_checkpoint_on_every_pod_and_the_job_finishes(
    tmp_path, report_dir, backend, restarts
):
    """The kill is retryable (137): every pod stops its ranks, and starts them again in place;
    they load the checkpoint and do the steps that are left, every one exactly once."""
    pods = _pods(tmp_path, report_dir, restarts, backend, FAIL="signal:SIGKILL@4", FAIL_RANK="1")
    for pod in pods:
        assert pod.wait(240) == 0, pod.stderr[-5000:]
        assert "restart 1 of 2: the job failed retryably" in pod.stderr, pod.stderr[-3000:]
        assert pod.stderr.count("restart ") == 1, pod.stderr[-3000:]
        message = pod.termination()
        assert [(r["generation"], r["exitCode"]) for r in message["restarts"]] == [(0, 137)], message
        assert message["restarts"][0]["rootCause"]["rank"] == 1, message
    assert f"done: {STEPS} steps, weights {STEPS}" in pods[1].stdout  # rank 0 is on node 0
    for rank in range(4):
        done = _steps(report_dir, rank)
        assert [step for _, step, _ in done] == list(range(STEPS)), done  # resumed where it stopped
        first, later = [d for d in done if d[0] == 0], [d for d in done if d[0] == 1]
        assert first and later and {d[2] for d in first} == {"0"} and {d[2] for d in later} == {"1"}, done


def test_a_permanent_failure_is_never_restarted(tmp_path, report_dir):
    pods = _pods(tmp_path, report_dir, "launcher", FAIL="exit:3@3", FAIL_RANK="2")
    for pod in pods:
        assert pod.wait(180) == 3, pod.stderr[-4000:]
        assert "restart " not in pod.stderr
        message = pod.termination()
        reason = message.get("causeReason", message["reason"])  # node 0's is PeerFailed, for node 1's rank
        assert (reason, message["retryable"], message["rootCause"]["rank"]) == ("Failed", False, 2), message
        assert "restarts" not in message
    assert {generation for generation, _, _ in _steps(report_dir, 0)} == {0}


def test_a_second_fault_as_the_job_restarts_takes_a_second_restart(tmp_path, report_dir):
    """Rank 3 is killed at step 3, and again at its first step after the restart, which resumes at
    step 3: the third start finishes the job."""
    pods = _pods(tmp_path, report_dir, "torchrun", FAIL="signal:SIGKILL@3@0,1", FAIL_RANK="3")
    for pod in pods:
        assert pod.wait(300) == 0, pod.stderr[-5000:]
        assert "restart 2 of 2" in pod.stderr
        assert [r["generation"] for r in pod.termination()["restarts"]] == [0, 1]
    done = _steps(report_dir, 0)
    assert [step for _, step, _ in done] == list(range(STEPS)), done
    assert {generation for generation, _, _ in done} == {0, 2}  # generation 1 never got through its first step


def test_when_restarts_run_out_the_last_verdict_stands_with_every_generations_cause(tmp_path, report_dir):
    pods = _pods(tmp_path, report_dir, "pet", FAIL="exit:143@2@0,1,2", FAIL_RANK="1")
    for pod in pods:
        assert pod.wait(300) == 143, pod.stderr[-5000:]
        message = pod.termination()
        assert (message["exitCode"], message["retryable"]) == (143, True), message
        assert [(r["generation"], r["exitCode"], r["rootCause"]["rank"]) for r in message["restarts"]] == [
            (0, 143, 1), (1, 143, 1)], message
        assert "restart 2 of 2" in pod.stderr and "restart 3" not in pod.stderr


def test_without_restarts_a_retryable_fault_still_ends_the_job_at_once(tmp_path, report_dir):
    pods = _pods(tmp_path, report_dir, "none", FAIL="signal:SIGKILL@2", FAIL_RANK="1")
    for pod in pods:
        assert pod.wait(180) == 137, pod.stderr[-4000:]
        assert "restart " not in pod.stderr and "restarts" not in pod.termination()


def test_a_rank_started_ahead_becomes_exactly_the_rank_torchrun_asked_for(tmp_path):
    """What torchrun gives Popen (launcher.torch.ahead): the standby rank takes on the rank's
    environment alone, writes to torchrun's files, and ends as python ends the program."""
    import subprocess
    import sys

    from launcher.torch.ahead import RanksAhead

    program = tmp_path / "rank.py"
    program.write_text(
        "import os, sys\n"
        "print('rank', os.environ['RANK'], 'stale' in os.environ, sys.argv, 'torch' in sys.modules, flush=True)\n"
        "print('to stderr', file=sys.stderr)\n"
        "sys.exit(int(sys.argv[1]))\n"
    )
    ahead = RanksAhead()
    ahead.start(1, clean_env(stale="1"), lambda: None)
    out, err = tmp_path / "out.log", tmp_path / "err.log"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        command = (sys.executable, "-u", str(program), "7")
        rank = ahead.take((), {"args": command, "env": clean_env(RANK="3"), "stdout": stdout, "stderr": stderr})
        assert rank is not None
        assert rank.wait(120) == 7
        # Anything Popen could not hand over (a pipe) starts as usual: no rank is taken for it.
        assert ahead.take((), {"args": command, "env": {}, "stdout": subprocess.PIPE}) is None
    assert out.read_text() == f"rank 3 False ['{program}', '7'] True\n"
    assert err.read_text() == "to stderr\n"


def test_a_hang_after_a_restart_is_still_caught_and_the_status_counts_the_restart(tmp_path, report_dir,
                                                                                    status_server):
    """Rank 1 is killed in the first start, and stops for good in the second: the hang watch,
    timed afresh from the restart, ends the job as Hang with every node's stacks. The TrainJob's
    status (the stand-in of Trainer's status server) counts the restart."""
    pods = _pods(tmp_path, report_dir, "env", FAIL="signal:SIGKILL@3", HANG="6@1", STEPS="1000", FAIL_RANK="1",
                 PROGRESS="1", LAUNCHER_MAX_RESTARTS="1", LAUNCHER_HANG_TIMEOUT="15", **status_server.env())
    for pod in pods:
        assert pod.wait(300) == 138, pod.stderr[-5000:]
        message = pod.termination()
        reason = message.get("causeReason", message["reason"])  # node 1's is PeerFailed, for node 0's hang
        assert (reason, message["retryable"]) == ("Hang", True), message
        assert [(r["generation"], r["exitCode"]) for r in message["restarts"]] == [(0, 137)], message
    assert "stuck_forever" in pods[1].stderr + pods[0].stderr  # rank 1's stack, taken on its node
    finals = status_server.wait_for(
        lambda seen: [r for r in seen if r["code"] == 200 and "exit_code" in _metrics(r)], what="the final status")
    final = _metrics([r for r in finals if r["code"] == 200 and "exit_code" in _metrics(r)][-1])
    assert (final["exit_code"], final["reason"], final["restarts"]) == ("138", "Hang", "1"), final


def _metrics(record: dict) -> dict[str, str]:
    status = (record.get("body") or {}).get("trainerStatus") or {}
    return {m["name"]: m["value"] for m in status.get("metrics", [])}


def _lose_pod_when_every_pod_trains(report_dir: Path, pods: list[Job], lost: int) -> None:
    """SIGKILL every process of pod ``lost`` (a lost machine) once a rank of each pod has stepped."""
    from test_endings import _kill_pod

    wait_for(lambda: (report_dir / "3.first-0").exists() and (report_dir / "0.first-0").exists(), 120,
             "every pod to train")
    _kill_pod(pods[1 - lost])  # pods are (node 1, node 0)


def test_a_lost_pod_without_rejoin_is_not_waited_for_the_pod_that_remains_exits_peer_lost_at_once(
    tmp_path, report_dir
):
    """--rejoin-timeout 0: the pod that remains does not hold for a replacement. 138 PeerLost,
    naming the lost pod, as without restarts, and Kubernetes starts both again."""
    pods = _pods(tmp_path, report_dir, "launcher", options=("--rejoin-timeout", "0"), STEPS="100000")
    _lose_pod_when_every_pod_trains(report_dir, pods, lost=1)
    survivor = pods[1]
    assert survivor.wait(120) == 138, survivor.stderr[-4000:]
    message = survivor.termination()
    assert (message["reason"], message["rootCause"]["node"]) == ("PeerLost", "job-node-0-1"), message
    assert "restart " not in survivor.stderr


@pytest.mark.parametrize("lost, held, backend", [(1, False, "static"), (0, False, "static"), (0, True, "static"),
                                                  (1, False, "c10d")],
                         ids=["worker-pod-lost", "master-pod-lost", "master-pod-lost-replaced-late", "c10d-pod-lost"])
def test_a_lost_pod_replaced_rejoins_and_every_pod_finishes_from_the_checkpoint(tmp_path, report_dir, lost, held,
                                                                                 backend):
    """Every process of one pod is SIGKILLed while the job trains (a lost machine); the test then
    plays the Job controller and starts its replacement, from nothing, with the same environment:
    at once, before the pod that remains has noticed the loss, or (``held``) once it holds for
    it. The pod that remains stops its ranks and holds; the replacement finds the generation it
    holds for at the lobby, on pod 0 (a replaced pod 0 serves a new one) and joins it; every rank
    resumes from the checkpoint and the job ends well. Losing pod 0 loses the job's store and
    lobby too."""
    steps = "400"
    port = free_port()
    options = ("--rejoin-timeout", "120")
    pods = _pods(tmp_path, report_dir, "launcher", backend, port=port, options=options, STEPS=steps)
    _lose_pod_when_every_pod_trains(report_dir, pods, lost)
    survivor = pods[lost]  # pods are (node 1, node 0): the other one
    if held:
        wait_for(lambda: "restart 1 of 2" in survivor.stderr, 120, "the pod that remains to restart")
    (replacement,) = _pods(tmp_path, report_dir, "launcher", backend, port=port, nodes=(lost,), options=options,
                           STEPS=steps)
    for pod in (survivor, replacement):
        try:
            code = pod.wait(300)
        except subprocess.TimeoutExpired:  # what each pod last said, to tell which one held up the other
            pytest.fail(f"still running after 300 s; survivor:\n{survivor.stderr[-4000:]}\n"
                        f"replacement:\n{replacement.stderr[-4000:]}")
        assert code == 0, pod.stderr[-5000:]
        message = pod.termination()
        assert message["exitCode"] == 0, message
    assert "rejoining the job at restart 1 of 2" in replacement.stderr, replacement.stderr[-3000:]
    restarted = survivor.termination()["restarts"]
    assert [(r["generation"], r["reason"], r["exitCode"]) for r in restarted] == [(0, "PeerLost", 138)], restarted
    assert restarted[0]["rootCause"]["node"] in (f"job-node-0-{lost}", "127.0.0.1"), restarted
    # Rank 0 says it: on node 0 with the static rendezvous, but c10d ranks the pods in an order of
    # its own (not PET_NODE_RANK), so after the rejoin it may be on either. No step lost, none twice:
    done = survivor.stdout + replacement.stdout
    assert done.count(f"done: {steps} steps, weights {steps}") == 1, done[-2000:]
    for rank in (0, 1, 2, 3):
        later = [d for d in _steps(report_dir, rank) if d[0] == 1]
        assert later and {d[2] for d in later} == {"1"}, later  # generation 1, as torch and the launcher say
        assert later[-1][1] == int(steps) - 1, later[-1]


def test_a_lost_pod_never_replaced_ends_the_others_peer_lost_after_the_rejoin_timeout(tmp_path, report_dir):
    pods = _pods(tmp_path, report_dir, "launcher", options=("--rejoin-timeout", "5"), STEPS="100000")
    _lose_pod_when_every_pod_trains(report_dir, pods, lost=1)
    survivor = pods[1]
    assert survivor.wait(180) == 138, survivor.stderr[-4000:]
    assert "restart 1 of 2" in survivor.stderr, survivor.stderr[-3000:]
    message = survivor.termination()
    assert (message["reason"], message["rootCause"]["node"], message["retryable"]) == (
        "PeerLost", "job-node-0-1", True), message
    assert "did not come back to rejoin the job within 5s (LAUNCHER_REJOIN_TIMEOUT)" in message["message"], message
    assert [(r["generation"], r["reason"]) for r in message["restarts"]] == [(0, "PeerLost")], message
