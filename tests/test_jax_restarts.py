"""JAX restarts in place (LAUNCHER_MAX_RESTARTS): real JAX processes on CPU (gloo), two emulated
pods under ``trainer-launcher local --framework jax``, a program that checkpoints every step.

On a retryable verdict every pod starts its process again in the same container, with the
coordinator a port further on; a permanent verdict ends the job at once; when restarts run out the
last verdict stands and the termination message keeps how each earlier generation ended. No mocks:
the only thing not real is the cluster.
"""

from __future__ import annotations

import sys
from pathlib import Path

from conftest import Job, launcher
from test_jax import JAX_PROCESS_TIMEOUT, jax_env

REPO = Path(__file__).resolve().parents[1]
RESUME = str(REPO / "tests" / "programs" / "jax_resume.py")
STEPS = 6


def resume_job(tmp_path: Path, max_restarts: int, fail: str) -> Job:
    """Two pods, process 1 failing as ``fail`` says (tests/programs/jax_resume.py's FAIL)."""
    argv = launcher("local", "--framework", "jax", "--nnodes", "2", "--", sys.executable, RESUME)
    env = jax_env(LAUNCHER_MAX_RESTARTS=str(max_restarts), CKPT=str(tmp_path / "ckpt.json"), STEPS=str(STEPS),
                  REPORT_DIR=str(tmp_path), FAIL=fail, FAIL_ID="1")
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
