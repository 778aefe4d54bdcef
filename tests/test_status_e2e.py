"""A job seen from its TrainJob: real torch and MPI jobs report to a real HTTPS status server
stand-in (tests/status_server.py) and real hangs end as Hang. Nothing is mocked here; the
Kubernetes API behind upstream's server is what the stand-in replaces."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, Job, clean_env, launcher, wait_for
from test_mpi import launcher_role, mpi, needs_cluster  # noqa: F401 (the fixture: every MPI installed)

PROGRAM = str(REPO / "tests" / "programs" / "progress_job.py")


def trainer_status(record: dict) -> dict:
    return (record.get("body") or {}).get("trainerStatus") or {}


def metrics(record: dict) -> dict[str, str]:
    return {m["name"]: m["value"] for m in trainer_status(record).get("metrics", [])}


def finals(records: list[dict]) -> list[dict]:
    return [r for r in records if r["code"] == 200 and "exit_code" in metrics(r)]


def local_torch(tmp_path: Path, *options: str, nnodes: int = 2, env: dict | None = None, name: str = "job") -> Job:
    argv = launcher("local", "--nnodes", str(nnodes), "--nproc-per-node", "1", "--grace-period", "3", *options,
                    "--", PROGRAM)
    return Job(argv, clean_env(**(env or {})), tmp_path, name)


def test_a_two_node_job_shows_progress_eta_and_metrics_throttled_then_its_outcome(tmp_path, status_server):
    job = local_torch(tmp_path, env={**status_server.env(), "STEPS": "24", "DELAY": "0.5", "STYLE": "hf"})
    assert job.wait(180) == 0, job.stderr
    records = status_server.wait_for(lambda rs: finals(rs), what="the final status")
    accepted = [r for r in records if r["code"] == 200]
    progress = [r for r in accepted if "exit_code" not in metrics(r)]
    assert progress, records
    # HF's log dicts became metrics; the bar's N/M and the step rate gave progress and an ETA.
    assert {"loss", "learning_rate", "epoch"} <= set(metrics(progress[-1]))
    # The first status may go out before the bar's first line (it says no percent then).
    percents = [p for r in progress if (p := trainer_status(r).get("progressPercentage")) is not None]
    assert percents and all(0 <= p < 100 for p in percents) and percents == sorted(percents)
    assert any("estimatedRemainingSeconds" in trainer_status(r) for r in progress)
    # One sender (node 0) and at most one send per 5 s, the final status excepted.
    times = [r["time"] for r in progress]
    assert all(later - earlier >= 4.9 for earlier, later in zip(times, times[1:])), times
    final = finals(records)
    assert len(final) == 1
    assert trainer_status(final[0])["progressPercentage"] == 100
    assert metrics(final[0])["exit_code"] == "0" and metrics(final[0])["retryable"] == "false"
    assert all(trainer_status(r)["lastUpdatedTime"].endswith("Z") for r in accepted)


def test_a_failing_rank_reaches_the_trainjob_as_its_root_cause(tmp_path, status_server):
    job = local_torch(tmp_path, env={**status_server.env(), "STEPS": "40", "DELAY": "0.3", "STYLE": "katib",
                                     "FAIL_RANK": "1", "FAIL_AT": "4"})
    assert job.wait(180) == 3, job.stderr
    final = finals(status_server.wait_for(lambda rs: finals(rs), what="the final status"))[0]
    shown = metrics(final)
    assert shown["exit_code"] == "3", job.stderr[-6000:]
    assert shown["retryable"] == "false"
    assert shown["root_cause_rank"] == "1"
    assert shown["reason"] == job.termination()["reason"] == "Failed"  # the root cause's, not "PeerFailed"
    assert "progressPercentage" not in trainer_status(final) or trainer_status(final)["progressPercentage"] < 100
    assert "loss" in shown  # the last metrics stay, beside the outcome


def test_a_down_server_a_422_and_a_rotated_token_neither_fail_nor_stop_the_job(tmp_path, status_server):
    status_server.fail_next(422, count=2, message="spec.trainerStatus: Invalid value")
    stop = tmp_path / "stop"
    job = local_torch(tmp_path, nnodes=1, env={**status_server.env(), "STEPS": "80", "DELAY": "0.5",
                                               "STYLE": "katib", "UNTIL": str(stop)})
    status_server.wait_for(lambda rs: [r for r in rs if r["code"] == 422], what="a refused status")
    status_server.wait_for(lambda rs: [r for r in rs if r["code"] == 200], what="a status accepted after the 422s")
    old = status_server.token
    rotated_at = time.time()
    status_server.rotate_token()
    status_server.wait_for(lambda rs: [r for r in rs if r["code"] == 200 and r["time"] > rotated_at + 0.5],
                           what="a status accepted with the new token")
    status_server.kill()
    # The job goes on without its server: three more steps, then the test lets it end.
    after = _last_step(job) + 3
    wait_for(lambda: _last_step(job) >= after or job.process.poll() is not None, 60, f"step {after}")
    stop.touch()
    assert job.wait(180) == 0, job.stderr
    assert after <= _last_step(job) < 80, job.stdout[-2000:]  # it went on after the kill, then read the stop file
    assert "Traceback" not in job.stderr
    assert old not in job.stderr + job.stdout and status_server.token not in job.stderr + job.stdout
    warnings = [line for line in job.stderr.splitlines() if "status server" in line]
    assert 1 <= len(warnings) <= 4, warnings  # said once per kind of trouble, not once per send


def _last_step(job: Job) -> int:
    steps = re.findall(r"\bstep=(\d+) loss=", job.stdout)
    return int(steps[-1]) if steps else 0


def test_without_the_status_env_or_a_hang_timeout_the_ranks_get_only_the_torch_exit_handler(tmp_path):
    """Nothing of the status services reaches the ranks; every torch rank has the launcher's exit
    handler for gloo groups (launcher/torch/hook, issue 36) before the user's PYTHONPATH."""
    from launcher.status import stacks
    from launcher.torch import rank_end

    out = tmp_path / "env"
    out.mkdir()
    job = local_torch(tmp_path, nnodes=1, env={"STEPS": "2", "DELAY": "0", "ENV_OUT": str(out)})
    assert job.wait(120) == 0, job.stderr
    seen = json.loads((out / "0.json").read_text())
    assert not [name for name in seen if name.startswith(("LAUNCHER_PROGRESS", "LAUNCHER_STACKS"))]
    assert seen["PYTHONPATH"].split(os.pathsep) == [stacks.HOOK_DIR, rank_end.HOOK_DIR, str(REPO)]
    assert seen[stacks.RANK_HOOKS_ENV] == rank_end.MODULE


def test_the_hf_callback_and_the_sdk_reach_the_trainjob_through_the_launcher_only(tmp_path, status_server):
    """The ranks' KUBEFLOW_TRAINER_SERVER_URL is the launcher's relay: the SDK's own
    update_trainjob_status works unchanged, and the server hears one sender."""
    program = tmp_path / "sdk_job.py"
    program.write_text(
        "from kubeflow.trainer import update_trainjob_status\n"
        "import sys, time\n"
        "for step in range(1, 13):\n"
        "    update_trainjob_status(progress_percent=step * 8, estimated_remaining_seconds=60 - step,\n"
        "                           metrics={'loss': 1.0 / step, 'current_step': step, 'total_steps': 12})\n"
        "    time.sleep(0.5)\n"
    )
    job = Job(launcher("torch", "--", "--standalone", "--nproc-per-node", "1", str(program)),
              clean_env(**status_server.env()), tmp_path)
    assert job.wait(120) == 0, job.stderr
    records = status_server.wait_for(lambda rs: finals(rs), what="the final status")
    agents = {r["user_agent"] for r in records}
    assert not [a for a in agents if a and "requests" in a], agents  # the SDK never reached the server itself
    progress = [r for r in records if r["code"] == 200 and "exit_code" not in metrics(r)]
    assert progress and any(trainer_status(r).get("progressPercentage", 0) >= 8 for r in progress)
    assert "loss" in metrics(finals(records)[0])


def test_an_mpi_launcher_pod_reports_rank_0s_output_through_mpirun(mpi, tmp_path, status_server):
    """The launcher role as root on one host (no ssh), as in tests/test_mpi.py: rank 0's progress
    lines reach the launcher through mpirun's output, and the launcher pod is the one sender.
    (`local --mpi` runs its pods in their own network namespace, out of the server's reach.)"""
    hostfile, keys = launcher_role(tmp_path, "localhost slots=2\n")
    program = tmp_path / "mpi_job.py"
    program.write_text(
        "import time\n"
        "from mpi4py import MPI\n"
        "comm = MPI.COMM_WORLD\n"
        "for step in range(1, 25):\n"
        "    comm.Barrier()\n"
        "    time.sleep(0.5)\n"
        "    if comm.rank == 0:\n"
        "        print(f'step={step}/24 loss={1.0 / step:.4f}', flush=True)\n"
    )
    flags = ["--oversubscribe"] if mpi["name"] == "openmpi" else []
    argv = launcher("mpi", "--mpirun", mpi["mpirun"], "--hostfile", str(hostfile), "--ssh-auth-mount-path", str(keys),
                    "--ssh-dir", str(tmp_path / "ssh"), "--", *flags, "python3", str(program))
    job = Job(argv, {**mpi["env"], **status_server.env(), "HOME": str(tmp_path)}, tmp_path)
    assert job.wait(180) == 0, job.stderr
    records = status_server.wait_for(lambda rs: finals(rs), what="the final status")
    progress = [r for r in records if r["code"] == 200 and "exit_code" not in metrics(r)]
    assert progress, records
    assert float(metrics(progress[-1])["loss"]) < 1.0
    assert 0 < trainer_status(progress[-1])["progressPercentage"] < 100
    assert metrics(finals(records)[0])["exit_code"] == "0"


@pytest.mark.parametrize("framework", ["jax", "xgboost"])
def test_jax_and_xgboost_jobs_report_too_process_0_sending(tmp_path, status_server, framework):
    program = str(REPO / "tests" / "programs" / "steps.py")
    job = Job(launcher("local", "--framework", framework, "--nnodes", "2", "--", sys.executable, program),
              clean_env(**status_server.env(), STEPS="14", DELAY="0.5"), tmp_path)
    assert job.wait(180) == 0, job.stderr
    records = status_server.wait_for(lambda rs: finals(rs), what="the final status")
    progress = [r for r in records if r["code"] == 200 and "exit_code" not in metrics(r)]
    assert progress and 0 < trainer_status(progress[-1])["progressPercentage"] < 100
    assert len(finals(records)) == 1 and metrics(finals(records)[0])["exit_code"] == "0"


def test_a_jax_process_that_stops_joining_the_collective_ends_the_job_as_a_hang_with_its_stack(tmp_path):
    """JAX's runner starts before the launcher has planned (it overlaps `import jax`): the stack
    hook reaches it with the launcher's word, not at interpreter start. Each pod sees its own
    process stop (every process prints), and takes its stack."""
    program = str(REPO / "tests" / "programs" / "jax_hang.py")
    job = Job(launcher("local", "--framework", "jax", "--nnodes", "2", "--hang-timeout", "8", "--grace-period", "3",
                       "--", sys.executable, program), clean_env(HANG_AT="4"), tmp_path)
    assert job.wait(180) == 138, job.stderr
    message = job.termination()
    assert message["reason"] == "Hang" and message["retryable"] is True, message
    assert "stuck_forever" in job.stderr  # process 1, where it stopped
    assert "process_allgather" in job.stderr  # process 0, waiting in the collective


@pytest.mark.parametrize("style", ["katib", "api"])
def test_a_rank_that_stops_calling_the_collective_ends_the_job_as_a_retryable_hang_with_stacks(tmp_path, style):
    last_step = tmp_path / "last-step"
    env = clean_env(STEPS="1000", DELAY="0.2", STYLE="katib", HANG_RANK="1", HANG_AT="6", LAST_STEP=str(last_step),
                    **({"API": "1"} if style == "api" else {}))
    grace, timeout = 3, 10
    job = Job(launcher("torch", "--hang-timeout", str(timeout), "--grace-period", str(grace), "--",
                       "--standalone", "--nproc-per-node", "2", PROGRAM), env, tmp_path)
    code = job.wait(120)
    ended = time.time()
    assert code == 138, job.stderr
    message = job.termination()
    assert message["reason"] == "Hang" and message["retryable"] is True
    # Every rank's Python stack is in the output: rank 1 where it stopped, rank 0 in the all-reduce.
    assert "stuck_forever" in job.stderr
    assert "all_reduce" in job.stderr
    # Both ranks last reported the same step; rank 0 waits inside the all-reduce, rank 1 is elsewhere.
    assert message["rootCause"]["rank"] == 1, message
    assert message["hang"]["stoppedRanks"] == [1]
    assert ended - float(last_step.read_text()) <= timeout + grace + 2 + 1, "the hang was not ended in time"


def test_a_hang_on_another_node_is_named_with_the_stack_taken_there(tmp_path):
    """Rank 0 (node 0) prints the progress and notices; rank 1, on node 1, is the one that stopped:
    node 0 asks every node's agent for its ranks' stacks through the job's store before the job is
    torn down, so the rank that stopped is named, with its node."""
    job = local_torch(tmp_path, "--hang-timeout", "8",
                      env={"STEPS": "1000", "DELAY": "0.2", "STYLE": "katib", "HANG_RANK": "1", "HANG_AT": "5"})
    assert job.wait(180) == 138, job.stderr
    message = job.termination()
    assert message["reason"] == "Hang" and message["retryable"] is True, message
    assert "[node-1] [stacks rank 1]" in job.stderr and "stuck_forever" in job.stderr
    assert message["rootCause"]["rank"] == 1, message
    assert "rank 1 on " in message["message"] and "stuck_forever" in message["message"]


def test_without_a_hang_timeout_a_hung_job_is_left_alone(tmp_path):
    """The knob is off by default: the same hang runs on until something else stops it."""
    env = clean_env(STEPS="1000", DELAY="0.1", STYLE="katib", HANG_RANK="1", HANG_AT="3")
    job = Job(launcher("torch", "--grace-period", "2", "--", "--standalone", "--nproc-per-node", "2", PROGRAM), env,
              tmp_path)
    wait_for(lambda: "step=2 " in job.stdout, what="the job's progress")
    with pytest.raises(subprocess.TimeoutExpired):
        job.wait(15)  # 15 s without progress: with --hang-timeout 10 it would have ended
    job.signal(signal.SIGTERM)
    assert job.wait(60) == 143
    assert "Hang" not in job.stderr


@needs_cluster
def test_an_mpi_hang_on_the_workers_ends_as_a_hang_with_the_stacks_of_the_ranks_there(mpi, tmp_path):
    """Every rank runs on a worker pod, which the launcher pod cannot signal: each answers the
    launcher's stack board over the job's network instead (launcher.status.board). Rank 0's
    progress reaches the launcher through mpirun's output; rank 1 stops joining the all-reduce."""
    program = str(REPO / "tests" / "programs" / "mpi_hang.py")
    argv = launcher("local", "--mpi", mpi["name"], "--nnodes", "2", "--nproc-per-node", "1", "--mpirun", mpi["mpirun"],
                    "--hang-timeout", "8", "--grace-period", "3", "--", program)
    job = Job(argv, {**mpi["env"], "HANG_AT": "4"}, tmp_path)
    assert job.wait(180) == 138, job.stderr
    message = job.termination()
    assert message["reason"] == "Hang" and message["retryable"] is True, message
    stacks = message["hang"]["stacks"]
    assert sorted(stacks) == ["0", "1"], message  # both ranks answered, from their pods
    assert any("stuck_forever" in frame for frame in stacks["1"]), stacks
    assert "[stacks rank 1] pid" in job.stderr and " on local-node-0-1" in job.stderr
    # mpi4py's all-reduce shows no Python frame: rank 0's source line says it waits in one.
    assert message["hang"]["stoppedRanks"] == [1], message
    assert message["rootCause"]["rank"] == 1 and message["rootCause"]["node"] == "local-node-0-1", message
    assert "rank 1 on local-node-0-1 in mpi_hang.py:12 in stuck_forever" in message["message"], message
