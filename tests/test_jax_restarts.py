"""JAX restarts in place (LAUNCHER_MAX_RESTARTS): real JAX processes on CPU (gloo), two emulated
pods under ``trainer-launcher local --framework jax``, a program that checkpoints every step.

On a retryable verdict every pod starts its process again in the same container, with the
coordinator a port further on; a permanent verdict ends the job at once; when restarts run out the
last verdict stands and the termination message keeps how each earlier generation ended. No mocks:
the only thing not real is the cluster.

The lost-pod tests start each pod as Trainer does (``trainer-launcher jax`` with JAX_*), SIGKILL one
pod's every process, and play Kubernetes' Job controller: they start its replacement, or not.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import Job, free_port, launcher, wait_for
from test_jax import JAX_PROCESS_TIMEOUT, jax_env

REPO = Path(__file__).resolve().parents[1]
RESUME = str(REPO / "tests" / "programs" / "jax_resume.py")
STEPS = 6


def resume_job(tmp_path: Path, max_restarts: int, fail: str, **extra: str) -> Job:
    """Two pods, process 1 failing as ``fail`` says (tests/programs/jax_resume.py's FAIL)."""
    argv = launcher("local", "--framework", "jax", "--nnodes", "2", "--", sys.executable, RESUME)
    env = jax_env(**{"LAUNCHER_MAX_RESTARTS": str(max_restarts), "CKPT": str(tmp_path / "ckpt.json"),
                     "STEPS": str(STEPS), "REPORT_DIR": str(tmp_path), "FAIL": fail, "FAIL_ID": "1", **extra})
    return Job(argv, env, tmp_path, name="local")


def steps_done(tmp_path: Path, process: int) -> list[tuple[int, int, str]]:
    """(generation, step, coordinator) of every step process ``process`` finished, in order."""
    path = tmp_path / f"{process}.steps"
    lines = path.read_text().split() if path.exists() else []
    return [(int(lines[i]), int(lines[i + 1]), lines[i + 2]) for i in range(0, len(lines), 3)]


def test_a_killed_process_restarts_every_pod_in_place_and_the_job_resumes_from_its_checkpoint(tmp_path):
    job = resume_job(tmp_path, 2, "signal:SIGKILL@3")

    assert job.wait(JAX_PROCESS_TIMEOUT * 2) == 0, job.stderr
    assert f"done: {STEPS} steps, weight {STEPS}" in job.stdout, job.stdout
    for node in (0, 1):  # every pod restarted, once
        assert job.stderr.count(f"[node-{node}] trainer-launcher: warning: restart 1 of 2") == 1, job.stderr
    assert "restart 2 of 2" not in job.stderr
    for process in (0, 1):
        done = steps_done(tmp_path, process)
        # every step once: 0..2 before the kill, the rest after the restart, from the checkpoint
        assert [(g, s) for g, s, _ in done] == [(0, 0), (0, 1), (0, 2)] + [(1, s) for s in range(3, STEPS)], done
        first, restarted = done[0][2], done[-1][2]
        host, port = first.rsplit(":", 1)
        assert restarted == f"{host}:{int(port) + 1}", done  # a coordination service of its own


def test_a_permanent_failure_is_never_restarted(tmp_path):
    job = resume_job(tmp_path, 2, "exit:3@2")

    assert job.wait(JAX_PROCESS_TIMEOUT) == 3, job.stderr
    message = job.termination()
    assert message["reason"] == "Failed" and message["retryable"] is False, message
    assert message["rootCause"]["rank"] == 1 and message["rootCause"]["node"] == "local-node-0-1", message
    assert "restarts" not in message
    assert "restart 1 of" not in job.stderr
    assert {g for process in (0, 1) for g, _, _ in steps_done(tmp_path, process)} == {0}


def test_when_restarts_run_out_the_last_verdict_stands_with_each_earlier_one_in_the_message(tmp_path):
    # 138, retryable: process 1 publishes its stop record in each generation, process 0 adopts it
    job = resume_job(tmp_path, 1, "exit:138@1@0,1")

    assert job.wait(JAX_PROCESS_TIMEOUT * 2) == 138, job.stderr
    message = job.termination()
    assert message["reason"] == "RetryableExit" and message["retryable"] is True, message
    assert message["rootCause"]["rank"] == 1 and message["rootCause"]["exitCode"] == 138, message
    (earlier,) = message["restarts"]
    assert (earlier["generation"], earlier["reason"], earlier["exitCode"]) == (0, "RetryableExit", 138), earlier
    assert earlier["rootCause"]["rank"] == 1 and earlier["rootCause"]["node"] == "local-node-0-1", earlier
    for node in (0, 1):
        assert job.stderr.count(f"[node-{node}] trainer-launcher: warning: restart 1 of 1") == 1, job.stderr
        # the second generation's stop record reached process 0: it stopped for process 1, again
    assert job.stderr.count("process 0 stops: process 1 on local-node-0-1 failed first (exit code 138)") == 2
    assert [(g, s) for g, s, _ in steps_done(tmp_path, 0)] == [(0, 0)]  # resumed at step 1, failed there again


def test_a_hang_after_a_restart_is_still_caught_and_the_status_counts_the_restart(tmp_path, status_server):
    """Process 1 is killed in the first start, and stops for good in the second: the hang watch,
    timed afresh from the restart, ends the job as Hang with the stuck process's stack. The
    TrainJob's status (the stand-in of Trainer's status server) counts the restart."""
    job = resume_job(tmp_path, 1, "signal:SIGKILL@2", STEPS="100000", STEP_TIME="0.05", HANG="4@1", PROGRESS="1",
                     LAUNCHER_HANG_TIMEOUT="15", **status_server.env())
    assert job.wait(JAX_PROCESS_TIMEOUT * 3) == 138, job.stderr[-5000:]
    message = job.termination()
    assert (message.get("causeReason", message["reason"]), message["retryable"]) == ("Hang", True), message
    # Process 1's pod says Killed (137); the other, which no stop record reached (a SIGKILLed process
    # writes none), PeerLost (138) naming that pod. Both retryable: both restarted.
    (earlier,) = message["restarts"]
    assert (earlier["generation"], earlier["rootCause"]["node"]) == (0, "local-node-0-1"), message
    assert earlier["exitCode"] in (137, 138), message
    assert "stuck_forever" in job.stderr, job.stderr[-5000:]  # process 1's stack, taken on its pod
    _assert_final_status(status_server, "138", "Hang", "1")


def _assert_final_status(status_server, exit_code: str, reason: str, restarts: str) -> None:
    from test_restarts import _metrics

    finals = status_server.wait_for(
        lambda seen: [r for r in seen if r["code"] == 200 and "exit_code" in _metrics(r)], what="the final status")
    final = _metrics([r for r in finals if r["code"] == 200 and "exit_code" in _metrics(r)][-1])
    assert (final["exit_code"], final["reason"], final["restarts"]) == (exit_code, reason, restarts), final


def _pod(tmp_path: Path, process: int, port: int, rejoin_timeout: int, steps: int) -> Job:
    """JAX process ``process`` of two, one pod, as Trainer starts it, restarting in place up to
    twice; a second start of the same process (a replacement pod) writes files of its own."""
    argv = launcher("jax", "--max-restarts", "2", "--rejoin-timeout", str(rejoin_timeout), "--", sys.executable,
                    RESUME)
    env = jax_env(JAX_NUM_PROCESSES="2", JAX_PROCESS_ID=str(process), JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                  HOSTNAME=f"jax-node-0-{process}", CKPT=str(tmp_path / "ckpt.json"), STEPS=str(steps),
                  STEP_TIME="0.05", REPORT_DIR=str(tmp_path))
    return Job(argv, env, tmp_path, name=f"pod{process}-{len(list(tmp_path.glob(f'pod{process}-*.out')))}")


def _lose_pod_when_both_train(tmp_path: Path, rejoin_timeout: int, steps: int, lost: int) -> tuple[int, Job]:
    """Two pods; once each process has done (and checkpointed) a step, every process of pod ``lost``
    is SIGKILLed (a lost machine). The coordinator's port, and the pod that remains."""
    from test_endings import _kill_pod

    port = free_port(span=4)  # a coordinator's port for each of 3 generations, then the lobby's
    pods = [_pod(tmp_path, process, port, rejoin_timeout, steps) for process in (0, 1)]
    wait_for(lambda: all((tmp_path / f"{p}.first-0").exists() for p in (0, 1)), JAX_PROCESS_TIMEOUT,
             "both processes to train")
    _kill_pod(pods[lost])
    return port, pods[1 - lost]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("lost", [1, 0], ids=["worker-pod-lost", "coordinator-pod-lost"])
def test_a_lost_pod_replaced_rejoins_and_the_job_finishes_from_the_checkpoint(tmp_path, lost):
    """The pod that remains stops its process and holds for the lost one; the test plays the Job
    controller and starts the replacement from nothing, with the same environment (port included),
    which finds at the lobby (process 0's; a replaced process 0 serves a new one) that the job is
    at restart 1 and joins it there: both resume from the checkpoint on generation 1's coordinator
    port, and the job ends as a run without a fault."""
    steps = 200
    port, survivor = _lose_pod_when_both_train(tmp_path, 120, steps, lost)
    wait_for(lambda: "restart 1 of 2" in survivor.stderr or survivor.process.poll() is not None,
             JAX_PROCESS_TIMEOUT, "the pod that remains to restart")
    assert "restart 1 of 2" in survivor.stderr, survivor.stderr[-4000:]
    replacement = _pod(tmp_path, lost, port, 120, steps)
    for pod in (survivor, replacement):
        assert pod.wait(JAX_PROCESS_TIMEOUT * 2) == 0, pod.stderr[-5000:]
        assert pod.termination()["exitCode"] == 0, pod.termination()
    assert "rejoining the job at restart 1 of 2" in replacement.stderr, replacement.stderr[-3000:]
    restarted = survivor.termination()["restarts"]
    assert [(r["generation"], r["reason"], r["exitCode"]) for r in restarted] == [(0, "PeerLost", 138)], restarted
    process_0 = survivor if lost == 1 else replacement
    assert f"done: {steps} steps, weight {steps}" in process_0.stdout, process_0.stdout[-2000:]  # each step once
    done = {p: steps_done(tmp_path, p) for p in (0, 1)}
    resumed = {p: [s for g, s, _ in done[p] if g == 1] for p in (0, 1)}
    start = resumed[0][0] if resumed[0] else -1
    for p in (0, 1):
        # Both resumed at the step after the checkpoint's, in generation 1 (LAUNCHER_RESTART_COUNT),
        # the replacement too, on generation 1's coordinator, and did the rest of the job.
        assert start > 0 and resumed[p] == list(range(start, steps)), done[p]
        assert {c for g, _, c in done[p] if g == 1} == {f"127.0.0.1:{port + 1}"}, done[p]
        # Before the kill: every step from 0 on, up to the checkpoint's give or take the one the
        # kill cut short (SIGKILL lands between a step's collective, its record and its checkpoint).
        first = [s for g, s, _ in done[p] if g == 0]
        assert first == list(range(len(first))) and abs(len(first) - start) <= 1, done[p]


@pytest.mark.timeout(600)
def test_a_lost_pod_never_replaced_ends_the_other_peer_lost_after_the_rejoin_timeout(tmp_path):
    _, survivor = _lose_pod_when_both_train(tmp_path, 5, 100000, lost=1)
    assert survivor.wait(JAX_PROCESS_TIMEOUT) == 138, survivor.stderr[-4000:]
    assert "restart 1 of 2" in survivor.stderr, survivor.stderr[-3000:]
    message = survivor.termination()
    assert (message["reason"], message["rootCause"]["node"], message["retryable"]) == (
        "PeerLost", "jax-node-0-1", True), message
    assert "did not come back to rejoin the job within 5s (LAUNCHER_REJOIN_TIMEOUT)" in message["message"], message
    assert [(r["generation"], r["reason"]) for r in message["restarts"]] == [(0, "PeerLost")], message
