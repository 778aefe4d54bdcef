"""XGBoost restarts in place (LAUNCHER_MAX_RESTARTS): real xgboost workers on CPU, a real RabitTracker
and stop board, two emulated pods under ``trainer-launcher local --framework xgboost`` (or two pods
by hand), a program that checkpoints every round.

On a retryable verdict every pod starts again in the same container: pod 0 a new tracker and stop
board two ports further on, every pod new workers told LAUNCHER_RESTART_COUNT; a permanent verdict
ends the job at once; when restarts run out the last verdict stands and the termination message
keeps how each earlier generation ended; a lost pod's replacement rejoins the others at the
generation they hold for (pod 0's lobby, LAUNCHER_REJOIN_TIMEOUT), and with --rejoin-timeout 0 the
pod that remains exits 138 PeerLost at once. No mocks: the only thing not real is the cluster
(a test that replaces a pod plays Kubernetes' Job controller).
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from conftest import Job, free_port, launcher, wait_for
from test_xgboost import TRAIN, UPSTREAM, env, models, pod_env, reports

REPO = Path(__file__).resolve().parents[1]
RESUME = str(REPO / "tests" / "programs" / "xgboost_resume.py")
ROUNDS = 6
TIMEOUT = 300


@pytest.fixture
def out(tmp_path: Path) -> Path:
    """Where the programs write (OUT_DIR), as in test_xgboost."""
    path = tmp_path / "out"
    path.mkdir()
    return path


def resume_job(tmp_path: Path, out: Path, fail: str, *flags: str, **extra: str) -> Job:
    """Two pods, task 1 failing as ``fail`` says (tests/programs/xgboost_resume.py's FAIL)."""
    argv = launcher("local", "--framework", "xgboost", "--nnodes", "2", *flags, "--", "python", RESUME)
    variables = env(out, **{"CKPT": str(tmp_path / "ckpt.ubj"), "ROUNDS": str(ROUNDS), "FAIL": fail,
                            "FAIL_TASK": "1", **extra})
    return Job(argv, variables, tmp_path, name="local")


def rounds_done(out: Path, task: int) -> list[tuple[int, int, int]]:
    """(generation, round, tracker port) of every round task ``task`` finished, in order."""
    path = out / f"{task}.rounds"
    lines = path.read_text().split() if path.exists() else []
    return [(int(lines[i]), int(lines[i + 1]), int(lines[i + 2])) for i in range(0, len(lines), 3)]


def test_a_killed_worker_restarts_every_pod_in_place_and_the_job_resumes_from_its_checkpoint(tmp_path, out):
    job = resume_job(tmp_path, out, "signal:SIGKILL@3", "--max-restarts", "2")

    assert job.wait(TIMEOUT) == 0, job.stderr
    for node in (0, 1):  # every pod restarted, once
        assert job.stderr.count(f"[node-{node}] trainer-launcher: warning: restart 1 of 2") == 1, job.stderr
    assert "restart 2 of 2" not in job.stderr
    assert job.stderr.count("xgboost tracker: listening") == 2  # pod 0 started a tracker for each generation
    for task in (0, 1):
        done = rounds_done(out, task)
        # every round once: 0..2 before the kill, the rest after the restart, from the checkpoint
        assert [(g, r) for g, r, _ in done] == [(0, 0), (0, 1), (0, 2)] + [(1, r) for r in range(3, ROUNDS)], done
        first, restarted = done[0][2], done[-1][2]
        assert restarted == first + 2, done  # a tracker of its own, past the last one's stop board
    trained = models(out)
    assert sorted(trained) == [0, 1] and len(set(trained.values())) == 1, "the workers' models differ"
    assert f"task 0 done: {ROUNDS} rounds" in job.stdout, job.stdout


def test_with_the_programs_own_tracker_a_restart_runs_it_on_the_next_port(tmp_path, out):
    """--xgboost-tracker program: upstream's example, whose task 0 starts a RabitTracker on
    DMLC_TRACKER_PORT, run as given; task 1 is SIGKILLed as it starts, in generation 0 only."""
    code = ("import os, runpy, signal\n"
            "generation, task, port = (os.environ[name] for name in "
            "('LAUNCHER_RESTART_COUNT', 'DMLC_TASK_ID', 'DMLC_TRACKER_PORT'))\n"
            "open(os.path.join(os.environ['OUT_DIR'], f'{task}.ports'), 'a').write(f'{generation} {port}\\n')\n"
            "if generation == '0' and task == '1':\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n"
            f"runpy.run_path({UPSTREAM!r}, run_name='__main__')\n")
    argv = launcher("local", "--framework", "xgboost", "--nnodes", "2", "--xgboost-tracker", "program",
                    "--max-restarts", "1", "--", "python", "-c", code)
    job = Job(argv, env(out), tmp_path, name="local")

    assert job.wait(TIMEOUT) == 0, job.stderr
    for node in (0, 1):
        assert job.stderr.count(f"[node-{node}] trainer-launcher: warning: restart 1 of 1") == 1, job.stderr
    ports = {task: (out / f"{task}.ports").read_text().split() for task in (0, 1)}
    first = int(ports[0][1])
    assert ports[0] == ports[1] == ["0", str(first), "1", str(first + 2)], ports
    trained = models(out)
    assert sorted(trained) == [0, 1] and len(set(trained.values())) == 1, "the workers' models differ"


def test_a_permanent_failure_is_never_restarted(tmp_path, out):
    job = resume_job(tmp_path, out, "exit:3@2", LAUNCHER_MAX_RESTARTS="2")

    assert job.wait(TIMEOUT) == 3, job.stderr
    message = job.termination()
    assert message["reason"] == "Failed" and message["retryable"] is False, message
    assert message["rootCause"]["rank"] == 1 and message["rootCause"]["exitCode"] == 3, message
    assert "restarts" not in message
    assert "restart 1 of" not in job.stderr
    assert {g for task in (0, 1) for g, _, _ in rounds_done(out, task)} == {0}


def test_when_restarts_run_out_the_last_verdict_stands_with_each_earlier_one_in_the_message(tmp_path, out):
    # 138, retryable: task 1's pod posts its stop record in each generation, and pod 0 adopts it
    job = resume_job(tmp_path, out, "exit:138@1@0,1", LAUNCHER_MAX_RESTARTS="1")

    assert job.wait(TIMEOUT) == 138, job.stderr
    message = job.termination()
    assert message["reason"] == "RetryableExit" and message["retryable"] is True, message
    assert message["rootCause"]["rank"] == 1 and message["rootCause"]["exitCode"] == 138, message
    (earlier,) = message["restarts"]
    assert (earlier["generation"], earlier["reason"], earlier["exitCode"]) == (0, "RetryableExit", 138), earlier
    assert earlier["rootCause"]["rank"] == 1, earlier
    for node in (0, 1):
        assert job.stderr.count(f"[node-{node}] trainer-launcher: warning: restart 1 of 1") == 1, job.stderr
    assert [(g, r) for g, r, _ in rounds_done(out, 0)] == [(0, 0)]  # resumed at round 1, failed there again
    assert job.stdout.count("task 1 ends (exit:138) in generation") == 2, job.stdout


def test_a_hang_after_a_restart_is_still_caught_and_the_status_counts_the_restart(tmp_path, out, status_server):
    """Task 1 is killed in the first start, and stops for good in the second: the hang watch,
    timed afresh from the restart, ends the job as Hang with the stuck worker's stack. The
    TrainJob's status (the stand-in of Trainer's status server) counts the restart."""
    from test_jax_restarts import _assert_final_status

    job = resume_job(tmp_path, out, "signal:SIGKILL@2", ROUNDS="100000", ROUND_TIME="0.05", HANG="4@1",
                     PROGRESS="1", LAUNCHER_MAX_RESTARTS="1", LAUNCHER_HANG_TIMEOUT="15", **status_server.env())
    assert job.wait(TIMEOUT) == 138, job.stderr[-5000:]
    message = job.termination()
    assert (message.get("causeReason", message["reason"]), message["retryable"]) == ("Hang", True), message
    assert [(r["generation"], r["exitCode"]) for r in message["restarts"]] == [(0, 137)], message
    assert "stuck_forever" in job.stderr, job.stderr[-5000:]  # task 1's stack, taken on its pod
    _assert_final_status(status_server, "138", "Hang", "1")


def test_without_restarts_a_killed_worker_ends_the_job_as_before(tmp_path, out):
    job = resume_job(tmp_path, out, "signal:SIGKILL@1")

    assert job.wait(TIMEOUT) == 137, job.stderr
    message = job.termination()
    assert message["retryable"] is True and message["rootCause"]["rank"] == 1, message
    assert "restarts" not in message and "restart 1 of" not in job.stderr
    assert {g for task in (0, 1) for g, _, _ in rounds_done(out, task)} == {0}


def test_a_lost_pod_without_rejoin_is_not_waited_for_the_pod_that_remains_exits_peer_lost_at_once(tmp_path, out):
    """--rejoin-timeout 0: pod 0 SIGKILLed whole (its launcher, tracker and board) and pod 1 does not
    hold for a replacement: 138 PeerLost, as without restarts, and Kubernetes starts both again."""
    port = free_port(span=6)  # two restarts' trackers and boards, were they to start
    pods = [Job(launcher("xgboost", "--rejoin-timeout", "0", "--", "python", TRAIN),
                pod_env(out, pod, 2, port, BEHAVIOUR="sleep", LAUNCHER_MAX_RESTARTS="2"), tmp_path, f"pod{pod}")
            for pod in (0, 1)]
    wait_for(lambda: len(reports(out)) == 2, timeout=120, what="both workers inside the collective")
    pods[0].signal(signal.SIGKILL)
    assert pods[1].wait(60) == 138, pods[1].stderr
    message = pods[1].termination()
    assert (message["reason"], message["retryable"]) == ("PeerLost", True), message
    assert "pod 0 went away without a word" in message["message"], message
    assert "restart 1 of" not in pods[1].stderr and "restarts" not in message


# --- a lost pod rejoins ------------------------------------------------------------------------------

REJOIN_ROUNDS = 200  # at ROUND_TIME 0.05: ten seconds of training, for the kill to land in


def rejoin_pod(tmp_path: Path, out: Path, pod: int, port: int, rejoin_timeout: str, name: str) -> Job:
    """Pod ``pod`` of two as Trainer starts it, restarting in place up to twice; a replacement is
    started the same way, with the same environment and ports."""
    argv = launcher("xgboost", "--max-restarts", "2", "--rejoin-timeout", rejoin_timeout, "--", "python", RESUME)
    variables = pod_env(out, pod, 2, port, CKPT=str(tmp_path / "ckpt.ubj"), ROUNDS=str(REJOIN_ROUNDS),
                        ROUND_TIME="0.05")
    return Job(argv, variables, tmp_path, name)


def lose_pod_when_both_train(tmp_path: Path, out: Path, lost: int, rejoin_timeout: str) -> tuple[int, list[Job]]:
    """Both pods started; once each worker has done a round of generation 0, every process of pod
    ``lost`` SIGKILLed (a lost machine). The job's tracker port and its pods, by pod index."""
    from test_endings import _kill_pod

    port = free_port(span=7)  # two restarts' trackers and boards, and the lobby above them
    pods = [rejoin_pod(tmp_path, out, pod, port, rejoin_timeout, f"pod{pod}") for pod in (0, 1)]
    wait_for(lambda: all((out / f"{task}.first-0").exists() for task in (0, 1)), 120, "both workers to train")
    _kill_pod(pods[lost])
    return port, pods


@pytest.mark.parametrize("lost", [1, 0], ids=["worker-pod-lost", "tracker-pod-lost"])
def test_a_lost_pod_replaced_rejoins_and_the_job_resumes_from_its_checkpoint(tmp_path, out, lost):
    """Every process of one pod SIGKILLed while the job trains; the test then plays Kubernetes' Job
    controller and starts its replacement, from nothing, with the same environment and ports. The
    pod that remains stops its worker and holds; the replacement finds the generation it holds for at
    the lobby, on pod 0, and joins it; both workers resume from the checkpoint. Losing pod 0 loses
    the tracker, the stop board and the lobby too: its replacement serves a new lobby."""
    port, pods = lose_pod_when_both_train(tmp_path, out, lost, "120")
    survivor = pods[1 - lost]
    wait_for(lambda: "restart 1 of 2" in survivor.stderr, 120, "the pod that remains to restart")
    replacement = rejoin_pod(tmp_path, out, lost, port, "120", f"pod{lost}-replacement")

    for pod in (survivor, replacement):
        assert pod.wait(TIMEOUT) == 0, pod.stderr[-5000:]
    assert "rejoining the job at restart 1 of 2" in replacement.stderr, replacement.stderr[-3000:]
    restarted = survivor.termination()["restarts"]
    assert [(r["generation"], r["reason"], r["exitCode"]) for r in restarted] == [(0, "PeerLost", 138)], restarted
    # The program's own record. Generation 1: both workers, the replacement's too, from the round
    # after the checkpoint to the last. Generation 0: each worker's rounds in order from the first;
    # together every round the checkpoint held, none skipped, and at most one more: the round in
    # flight when the pod went, finished by one worker but not yet saved, done again.
    before, later = ({task: [r for g, r, _ in rounds_done(out, task) if g == generation] for task in (0, 1)}
                     for generation in (0, 1))
    resumed = later[0][0] if later[0] else 0
    assert resumed > 0 and later[0] == later[1] == list(range(resumed, REJOIN_ROUNDS)), later
    assert all(done == list(range(len(done))) for done in before.values()), before
    assert max(map(len, before.values())) in (resumed, resumed + 1), (before, resumed)
    trained = models(out)
    assert sorted(trained) == [0, 1] and len(set(trained.values())) == 1, "the workers' models differ"
    assert f"task 0 done: {REJOIN_ROUNDS} rounds" in (pods[0] if lost == 1 else replacement).stdout


def test_a_lost_pod_never_replaced_ends_the_other_peer_lost_after_the_rejoin_timeout(tmp_path, out):
    _, pods = lose_pod_when_both_train(tmp_path, out, 1, "5")
    survivor = pods[0]
    assert survivor.wait(180) == 138, survivor.stderr[-4000:]
    assert "restart 1 of 2" in survivor.stderr, survivor.stderr[-3000:]
    message = survivor.termination()
    assert (message["reason"], message["retryable"]) == ("PeerLost", True), message
    assert "did not come back to rejoin the job within 5s (LAUNCHER_REJOIN_TIMEOUT)" in message["message"], message
    assert [(r["generation"], r["reason"]) for r in message["restarts"]] == [(0, "PeerLost")], message


@pytest.mark.parametrize(("flags", "said"), [
    (("--rejoin-timeout", "0"), "did not join the tracker"),
    ((), "node rank 1 never checked in at the job's lobby"),
], ids=["at-the-tracker", "at-the-lobby"])
def test_workers_that_never_all_join_are_not_restarted_in_place(tmp_path, out, flags, said):
    """Pod 1 of 2 never starts (still pending). Without a lobby (--rejoin-timeout 0) pod 0's tracker
    waits for the workers: were pod 0 to start again on the next tracker port, pod 1, coming late,
    would look for the first one. With one (the default) pod 0 waits at the lobby for pod 1 to check
    in, before its tracker starts. Either way pod 0 ends 138 as without restarts."""
    port = free_port(span=7)  # two restarts' trackers and boards, and the lobby above them
    # 15 s: the same deadline bounds the tracker's own start (its xgboost import) on a busy machine.
    job = Job(launcher("xgboost", "--rendezvous-timeout", "15", *flags, "--", "python", TRAIN),
              pod_env(out, 0, 2, port, LAUNCHER_MAX_RESTARTS="2"), tmp_path)
    assert job.wait(120) == 138, job.stderr
    message = job.termination()
    assert message["reason"] == "RendezvousTimeout" and said in message["message"], message
    assert "restart 1 of" not in job.stderr and "restarts" not in message
