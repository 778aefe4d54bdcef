"""XGBoost restarts in place (LAUNCHER_MAX_RESTARTS): real xgboost workers on CPU, a real RabitTracker
and stop board, two emulated pods under ``trainer-launcher local --framework xgboost`` (or two pods
by hand), a program that checkpoints every round.

On a retryable verdict every pod starts again in the same container: pod 0 a new tracker and stop
board two ports further on, every pod new workers told LAUNCHER_RESTART_COUNT; a permanent verdict
ends the job at once; when restarts run out the last verdict stands and the termination message
keeps how each earlier generation ended; a lost pod is not restarted in place. No mocks: the only
thing not real is the cluster.
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
    variables = env(out, CKPT=str(tmp_path / "ckpt.ubj"), ROUNDS=str(ROUNDS), FAIL=fail, FAIL_TASK="1", **extra)
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


def test_without_restarts_a_killed_worker_ends_the_job_as_before(tmp_path, out):
    job = resume_job(tmp_path, out, "signal:SIGKILL@1")

    assert job.wait(TIMEOUT) == 137, job.stderr
    message = job.termination()
    assert message["retryable"] is True and message["rootCause"]["rank"] == 1, message
    assert "restarts" not in message and "restart 1 of" not in job.stderr
    assert {g for task in (0, 1) for g, _, _ in rounds_done(out, task)} == {0}


def test_a_lost_pod_is_not_restarted_in_place_the_pod_that_remains_exits_peer_lost_at_once(tmp_path, out):
    """Pod 0 SIGKILLed whole (its launcher, tracker and board): its replacement would start from the
    first generation's tracker port, where a restarted pod 1 would never look, so pod 1 does not
    restart in place: 138 PeerLost, as without restarts, and Kubernetes starts both again."""
    port = free_port(span=6)  # two restarts' trackers and boards, were they to start
    pods = [Job(launcher("xgboost", "--", "python", TRAIN),
                pod_env(out, pod, 2, port, BEHAVIOUR="sleep", LAUNCHER_MAX_RESTARTS="2"), tmp_path, f"pod{pod}")
            for pod in (0, 1)]
    wait_for(lambda: len(reports(out)) == 2, timeout=120, what="both workers inside the collective")
    pods[0].signal(signal.SIGKILL)
    assert pods[1].wait(60) == 138, pods[1].stderr
    message = pods[1].termination()
    assert (message["reason"], message["retryable"]) == ("PeerLost", True), message
    assert "pod 0 went away without a word" in message["message"], message
    assert "restart 1 of" not in pods[1].stderr and "restarts" not in message


def test_workers_that_never_all_join_are_not_restarted_in_place(tmp_path, out):
    """Pod 1 of 2 never starts (still pending): were pod 0 to start again on the next tracker port,
    pod 1, coming late, would look for the first one. So pod 0 ends 138 as without restarts."""
    port = free_port(span=6)
    # 15 s: the same deadline bounds the tracker's own start (its xgboost import) on a busy machine.
    job = Job(launcher("xgboost", "--rendezvous-timeout", "15", "--", "python", TRAIN),
              pod_env(out, 0, 2, port, LAUNCHER_MAX_RESTARTS="2"), tmp_path)
    assert job.wait(120) == 138, job.stderr
    message = job.termination()
    assert message["reason"] == "RendezvousTimeout" and "did not join the tracker" in message["message"], message
    assert "restart 1 of" not in job.stderr and "restarts" not in message
