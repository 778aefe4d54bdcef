"""Real JAX processes under ``trainer-launcher jax``, on CPU with gloo collectives.

Two shapes: ``trainer-launcher local --framework jax`` (N pods on this machine, one supervisor),
and N independent ``trainer-launcher jax`` processes given the env Trainer injects, like N pods
that only share a network: there nothing but the JAX coordination service connects them, so
these show what a cluster would see. No mocks: the only thing not real is the cluster.
"""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import psutil

from conftest import Job, clean_env, free_port, launcher, needs_root, wait_for, with_private_names

REPO = Path(__file__).resolve().parents[1]
WORLD = str(REPO / "tests" / "programs" / "jax_world.py")
FAIL = str(REPO / "tests" / "programs" / "jax_fail.py")
JAX_PROCESS_TIMEOUT = 240  # seconds for a few JAX imports on two busy CPUs
# JAX alone keeps a failed job's processes 300 s in its shutdown barrier (bench/bench_jax.py).
JAX_SHUTDOWN_BARRIER = 300


def jax_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in clean_env().items() if not k.startswith("JAX_")}
    env.update(extra)
    return env


def local(tmp_path: Path, nnodes: int, *program: str, isolation: str = "none", **extra: str) -> Job:
    argv = launcher("local", "--framework", "jax", "--nnodes", str(nnodes), "--isolation", isolation,
                    "--", sys.executable, *program)
    return Job(argv, jax_env(**extra), tmp_path, name="local")


def pods(tmp_path: Path, process_ids: list[int], *program: str, **extra: str) -> list[Job]:
    """One ``trainer-launcher jax`` per entry of ``process_ids``, as Trainer would start the pods."""
    coordinator = f"127.0.0.1:{free_port()}"
    return [Job(launcher("jax", "--", sys.executable, *program),
                jax_env(JAX_NUM_PROCESSES=str(len(process_ids)), JAX_PROCESS_ID=str(pid),
                        JAX_COORDINATOR_ADDRESS=coordinator, HOSTNAME=f"tj-node-0-{index}", **extra),
                tmp_path, name=f"pod-{index}")
            for index, pid in enumerate(process_ids)]


def wait_all(jobs: list[Job], timeout: float = JAX_PROCESS_TIMEOUT) -> list[int]:
    return [job.wait(timeout) for job in jobs]


def no_process_runs(marker: str) -> bool:
    for process in psutil.process_iter(["cmdline", "status"]):
        try:
            if process.info["status"] != psutil.STATUS_ZOMBIE and marker in " ".join(process.info["cmdline"] or ()):
                return False
        except psutil.Error:
            continue
    return True


# --- a job that works ----------------------------------------------------------------------------

def test_local_runs_n_jax_processes_whose_bare_initialize_and_collectives_span_the_world(tmp_path):
    job = local(tmp_path, 3, WORLD, isolation="auto")  # as root: each pod its own name, resolved

    assert job.wait(JAX_PROCESS_TIMEOUT) == 0, job.stderr
    for index in range(3):
        assert f"[node-{index}] process {index} of 3: allgather sum 6, psum over 3 devices 3" in job.stdout, job.stdout
    assert job.termination()["exitCode"] == 0
    assert "Traceback" not in job.stderr


def test_a_script_that_initializes_jax_the_upstream_way_still_works(tmp_path):
    jobs = pods(tmp_path, [0, 1], WORLD, "--explicit")

    assert wait_all(jobs) == [0, 0], [job.stderr for job in jobs]
    for index, job in enumerate(jobs):
        assert f"process {index} of 2: allgather sum 3, psum over 2 devices 2" in job.stdout


def test_a_call_for_another_process_id_is_an_error_naming_both(tmp_path):
    program = tmp_path / "other_id.py"
    program.write_text("import jax\njax.distributed.initialize('127.0.0.1:1', 1, 5)\n")
    (job,) = pods(tmp_path, [0], str(program))

    assert job.wait(JAX_PROCESS_TIMEOUT) == 1
    assert "process_id=5" in job.stderr and "already initialized this process as process 0 of 1" in job.stderr
    assert job.termination()["rootCause"]["rank"] == 0


# --- a job that fails ------------------------------------------------------------------------------

def test_independent_pods_all_exit_with_the_failing_process_code_and_name_it(tmp_path):
    started = time.monotonic()
    jobs = pods(tmp_path, [0, 1, 2], FAIL, FAIL_ID="1", FAIL_CODE="3")

    codes = wait_all(jobs, JAX_SHUTDOWN_BARRIER - 30)  # JAX alone: every process held 300 s, then SIGABRT

    assert codes == [3, 3, 3], [job.stderr for job in jobs]
    messages = [job.termination() for job in jobs]
    for index, message in enumerate(messages):
        assert message["rootCause"]["rank"] == 1 and message["rootCause"]["node"] == "tj-node-0-1", message
        assert message["reason"] == ("Failed" if index == 1 else "PeerFailed"), message
        assert message["retryable"] is False
        assert "JAX process 1 on tj-node-0-1 exited with code 3" in message["message"]
    assert "unreachable" not in "".join(job.stdout for job in jobs)
    assert time.monotonic() - started < JAX_SHUTDOWN_BARRIER - 30


def test_local_names_the_process_whose_program_raised_and_its_error(tmp_path):
    job = local(tmp_path, 2, FAIL, FAIL_ID="0", FAIL_HOW="raise")

    assert job.wait(JAX_PROCESS_TIMEOUT) == 1, job.stderr
    message = job.termination()
    assert message["reason"] == "Failed" and message["rootCause"]["rank"] == 0
    assert message["rootCause"]["node"] == "local-node-0-0"
    assert message["error"] == "ValueError: the loss is NaN"
    # Python's own traceback, from the program's frame, not the launcher's
    assert 'jax_fail.py", line' in job.stderr and "runpy" not in job.stderr


def test_a_process_killed_without_a_word_is_the_root_cause_and_the_others_leave(tmp_path):
    job = local(tmp_path, 3, FAIL, FAIL_ID="2", FAIL_HOW="kill")

    assert job.wait(JAX_SHUTDOWN_BARRIER - 30) == 137, job.stderr
    message = job.termination()
    assert message["rootCause"]["rank"] == 2 and message["rootCause"]["signal"] == "SIGKILL", message
    assert message["retryable"] is True


def test_a_failing_program_that_is_not_python_gives_its_code_and_names_the_process(tmp_path):
    with socket.socket() as coordinator:  # process 0's port, up: the wait passes at once
        coordinator.bind(("127.0.0.1", 0))
        coordinator.listen()
        env = jax_env(JAX_NUM_PROCESSES="2", JAX_PROCESS_ID="1", HOSTNAME="tj-node-0-1",
                      JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{coordinator.getsockname()[1]}")
        job = Job(launcher("jax", "--", "sh", "-c", 'echo "I am $JAX_PROCESS_ID of $JAX_NUM_PROCESSES"; exit 4'),
                  env, tmp_path)
        assert job.wait(60) == 4

    assert "I am 1 of 2" in job.stdout
    message = job.termination()
    assert message["rootCause"] == {"node": "tj-node-0-1", "rank": 1, "localRank": None, "exitCode": 4, "signal": None}
    assert message["message"].startswith("JAX process 1 on tj-node-0-1 exited with code 4")


# --- a coordinator that never comes up -----------------------------------------------------------

def test_a_coordinator_port_that_never_opens_exits_138_naming_it(tmp_path):
    port = free_port()
    marker = str(tmp_path / "never.py")
    Path(marker).write_text("print('must not run')\n")
    job = Job(launcher("jax", "--", sys.executable, marker),
              jax_env(JAX_NUM_PROCESSES="2", JAX_PROCESS_ID="1", JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                      LAUNCHER_RENDEZVOUS_TIMEOUT="2", HOSTNAME="tj-node-0-1"), tmp_path)

    assert job.wait(JAX_PROCESS_TIMEOUT) == 138
    message = job.termination()
    assert message["reason"] == "RendezvousTimeout" and message["retryable"] is True
    assert f"coordinator 127.0.0.1:{port} (JAX process 0)" in message["message"]
    assert message["rootCause"]["rank"] == 0
    assert "must not run" not in job.stdout
    wait_for(lambda: no_process_runs(marker), 30, "the runner started early to be gone")


@needs_root
def test_a_coordinator_name_that_never_resolves_exits_138_naming_it(tmp_path):
    argv, _ = with_private_names(tmp_path, launcher("jax", "--", sys.executable, WORLD))
    job = Job(argv, jax_env(JAX_NUM_PROCESSES="2", JAX_PROCESS_ID="1", JAX_COORDINATOR_ADDRESS="tj-node-0-0.tj:29500",
                            LAUNCHER_RENDEZVOUS_TIMEOUT="2"), tmp_path)

    assert job.wait(JAX_PROCESS_TIMEOUT) == 138
    message = job.termination()
    assert message["reason"] == "RendezvousTimeout"
    assert "coordinator tj-node-0-0.tj:29500" in message["message"] and "never resolved" in message["message"]
    assert message["rootCause"]["node"] == "tj-node-0-0"


# --- multi-slice: two pods with one process id (kubeflow/trainer#3537) ---------------------------

def test_two_pods_with_one_process_id_are_named_as_such(tmp_path):
    jobs = pods(tmp_path, [0, 1, 1], WORLD, LAUNCHER_RENDEZVOUS_TIMEOUT="15")

    codes = wait_all(jobs)

    messages = [job.termination() for job in jobs]
    duplicate = [m for m in messages if m["reason"] == "DuplicateProcessId"]
    assert len(duplicate) == 1, messages
    assert duplicate[0]["exitCode"] == 2 and duplicate[0]["retryable"] is False
    assert "JAX_PROCESS_ID" in duplicate[0]["message"] and "kubeflow/trainer#3537" in duplicate[0]["message"]
    assert sorted(codes) == [2, 138, 138], messages  # the others could not complete the group in time


def test_in_a_kubernetes_pod_jax_takes_the_launchers_values_and_never_asks_the_api_server(tmp_path):
    """Every pod has KUBERNETES_SERVICE_HOST; with the ``kubernetes`` package installed (jax[k8s],
    the Kubeflow SDK: this test environment has it), jax's own cluster detection read the service
    account token and asked the API server about the pod, though the launcher passed every value:
    without the token it failed (RendezvousFailed, retried for ever), without RBAC it got a 403.
    Here the API server's address answers nothing and there is no token."""
    jobs = pods(tmp_path, [0, 1], WORLD, KUBERNETES_SERVICE_HOST="127.0.0.1", KUBERNETES_SERVICE_PORT=str(free_port()))
    assert wait_all(jobs) == [0, 0], [job.stderr[-2000:] for job in jobs]


# --- how the program is run ------------------------------------------------------------------------

def test_python_dash_c_runs_through_the_runner_with_its_arguments(tmp_path):
    code = "import jax, sys; jax.distributed.initialize(); print('world', jax.process_count(), sys.argv, __name__)"
    (job,) = pods(tmp_path, [0], "-c", code, "a", "b")

    assert job.wait(JAX_PROCESS_TIMEOUT) == 0, job.stderr
    assert "world 1 ['-c', 'a', 'b'] __main__" in job.stdout


def test_with_the_runner_turned_off_the_script_initializes_jax_itself(tmp_path):
    jobs = pods(tmp_path, [0, 1], WORLD, "--explicit", LAUNCHER_JAX_INITIALIZE="0")

    assert wait_all(jobs) == [0, 0], [job.stderr for job in jobs]
    assert "the program initializes JAX" in jobs[0].stderr
    assert "run.py" not in jobs[0].stderr


def test_sigterm_stops_the_job_within_the_grace_period(tmp_path):
    program = tmp_path / "train_forever.py"
    ready = tmp_path / "ready"
    program.write_text(
        "import time, jax\n"
        "jax.distributed.initialize()\n"
        f"open({str(ready)!r} + str(jax.process_index()), 'w').close()\n"
        "while True:\n    time.sleep(0.1)\n")
    (job,) = pods(tmp_path, [0], str(program), LAUNCHER_GRACE_PERIOD="3")
    wait_for(lambda: Path(f"{ready}0").exists() or job.process.poll() is not None, JAX_PROCESS_TIMEOUT, "the program")

    job.signal(15)  # JAX's preemption notifier catches it in the process: the launcher's grace bounds it

    assert job.wait(60) == 143
    assert job.termination()["reason"] == "Terminated"
    wait_for(lambda: no_process_runs(str(program)), 30, "the JAX process to be gone")


def test_independent_pods_whose_peer_was_killed_leave_retryably_and_do_not_claim_the_failure(tmp_path):
    started = time.monotonic()
    jobs = pods(tmp_path, [0, 1, 2], FAIL, FAIL_ID="1", FAIL_HOW="kill")

    codes = wait_all(jobs, JAX_SHUTDOWN_BARRIER - 30)

    assert codes == [138, 137, 138], [job.stderr for job in jobs]
    killed = jobs[1].termination()
    assert killed["reason"] == "Killed" and killed["rootCause"]["rank"] == 1
    for index in (0, 2):
        message = jobs[index].termination()
        assert message["reason"] == "PeerLost" and message["retryable"] is True, message
        assert message["rootCause"]["rank"] == index  # itself: it cannot know who vanished
    assert time.monotonic() - started < JAX_SHUTDOWN_BARRIER - 30
