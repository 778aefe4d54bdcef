"""`trainer-launcher xgboost` and `local --framework xgboost` with real xgboost: a real RabitTracker,
real workers training one model over TCP on CPU, real failures and signals. No GPU here: a pod's
"GPUs" are stood in for by LAUNCHER_XGBOOST_WORKERS_PER_POD / `local --nproc-per-node`, which is
what the GPU count would set."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from conftest import IS_ROOT, Job, alive, clean_env, free_port, launcher, wait_for

REPO = Path(__file__).resolve().parents[1]
TRAIN = str(REPO / "tests" / "programs" / "xgboost_train.py")
UPSTREAM = str(REPO / "tests" / "programs" / "xgboost_upstream.py")


def env(out: Path, **extra: str) -> dict[str, str]:
    base = {k: v for k, v in clean_env().items() if not k.startswith("DMLC_")}
    # The programs run as `python ...`: this interpreter, which has xgboost.
    base["PATH"] = f"{Path(sys.executable).parent}:{base.get('PATH', '/usr/bin:/bin')}"
    return {**base, "OUT_DIR": str(out), **extra}


def pod_env(out: Path, pod: int, workers: int, port: int, **extra: str) -> dict[str, str]:
    """What Trainer injects into pod ``pod``, the tracker at loopback."""
    return env(out, DMLC_TRACKER_URI="127.0.0.1", DMLC_TRACKER_PORT=str(port), DMLC_TASK_ID=str(pod),
               DMLC_NUM_WORKER=str(workers), **extra)


def reports(out: Path) -> dict[int, dict]:
    return {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in out.glob("worker-*.json")}


def models(out: Path) -> dict[int, bytes]:
    return {int(p.name.split("-")[1].split(".")[0]): p.read_bytes() for p in out.glob("model-*.ubj")}


@pytest.fixture
def out(tmp_path: Path) -> Path:
    path = tmp_path / "out"
    path.mkdir()
    return path


# --- one model from every worker ------------------------------------------------------------------

def test_local_trains_one_model_over_three_pods_and_every_worker_ends_with_the_same_bytes(tmp_path, out):
    job = Job(launcher("local", "--framework", "xgboost", "--nnodes", "3", "--", "python", TRAIN), env(out), tmp_path)
    assert job.wait(300) == 0, job.stderr
    trained = models(out)
    assert sorted(trained) == [0, 1, 2]
    assert len(set(trained.values())) == 1, "the workers' models differ"
    seen = reports(out)
    assert {task: (r["rank"], r["world"], r["distributed"]) for task, r in seen.items()} == {
        0: (0, 3, True), 1: (1, 3, True), 2: (2, 3, True)}
    assert "[node-0] [tracker] trainer-launcher: xgboost tracker: listening" in job.stderr
    assert "Failed to initialize worker proxy" not in job.stdout + job.stderr  # the readiness probes, dropped
    if IS_ROOT:  # each pod its own hostname; the tracker reached by the name Trainer injects
        assert {r["hostname"] for r in seen.values()} == {"local-node-0-0", "local-node-0-1", "local-node-0-2"}
        assert "tracker local-node-0-0.local:" in job.stderr


def test_upstreams_example_runs_unchanged_with_two_workers_per_pod(tmp_path, out):
    """Its task 0 builds a RabitTracker on DMLC_TRACKER_PORT and every task enters CommunicatorContext
    with the DMLC_* values: both join what the launcher set up. Two "GPUs" per pod: 4 workers."""
    job = Job(launcher("local", "--framework", "xgboost", "--nnodes", "2", "--nproc-per-node", "2", "--",
                       "python", UPSTREAM), env(out), tmp_path)
    assert job.wait(300) == 0, job.stderr
    trained = models(out)
    assert sorted(trained) == [0, 1, 2, 3] and len(set(trained.values())) == 1
    assert {task: (r["rank"], r["world"]) for task, r in reports(out).items()} == {
        0: (0, 4), 1: (1, 4), 2: (2, 4), 3: (3, 4)}
    assert "pod 1, 2 worker(s) (tasks 2-3 of 4)" in job.stderr
    assert "[node-1 rank-3]" in job.stdout  # each worker's lines carry its task id


def test_a_shell_command_runs_as_given_and_the_programs_task_0_runs_the_tracker(tmp_path, out):
    job = Job(launcher("local", "--framework", "xgboost", "--nnodes", "2", "--", "sh", "-c", f'exec python "{UPSTREAM}"'),
              env(out), tmp_path)
    assert job.wait(300) == 0, job.stderr
    assert sorted(models(out)) == [0, 1] and len(set(models(out).values())) == 1
    assert "run by the program" in job.stderr and "[tracker]" not in job.stderr


def test_program_mode_from_the_environment_leaves_the_port_to_the_programs_own_tracker(tmp_path, out):
    """The launcher starts its tracker before it reads LAUNCHER_XGBOOST_TRACKER; told `program`, it
    sends that tracker away before it binds, so upstream's task 0 can bind the port itself."""
    job = Job(launcher("local", "--framework", "xgboost", "--nnodes", "2", "--", "python", UPSTREAM),
              env(out, LAUNCHER_XGBOOST_TRACKER="program"), tmp_path)
    assert job.wait(300) == 0, job.stderr
    assert sorted(models(out)) == [0, 1] and len(set(models(out).values())) == 1
    assert "run by the program" in job.stderr and "xgboost tracker: listening" not in job.stderr


def test_ranks_follow_task_ids_past_ten_workers(tmp_path, out):
    """The tracker sorts task ids as strings; the runner pads them, so task 10 is rank 10, not 2."""
    job = Job(launcher("local", "--framework", "xgboost", "--nnodes", "1", "--nproc-per-node", "11", "--",
                       "python", TRAIN), env(out, ROUNDS="2"), tmp_path)
    assert job.wait(300) == 0, job.stderr
    assert {task: r["rank"] for task, r in reports(out).items()} == {task: task for task in range(11)}


# --- failures name the worker ---------------------------------------------------------------------

@pytest.mark.parametrize("behaviour", ["exit:3", "crash:3"])
def test_a_worker_that_exits_3_fails_every_pod_with_3_naming_its_task_and_pod(tmp_path, out, behaviour):
    """crash: os._exit mid-round, which can leave xgboost's other workers in a collective until
    dmlc_timeout (30 min); the stop board ends them at once."""
    job = Job(launcher("local", "--framework", "xgboost", "--nnodes", "3", "--", "python", TRAIN),
              env(out, BEHAVIOUR=behaviour, FAIL_TASK="1"), tmp_path)
    assert job.wait(300) == 3, job.stderr
    message = job.termination()
    assert (message["exitCode"], message["retryable"], message["reason"]) == (3, False, "Failed")
    assert message["rootCause"]["rank"] == 1 and message["rootCause"]["exitCode"] == 3
    assert "task 1" in message["message"]
    if IS_ROOT:
        assert message["rootCause"]["node"] == "local-node-0-1"
    errors = {}  # each pod's verdict: its first error line (an "evidence:" line may follow it)
    for line in job.stderr.splitlines():
        if line.startswith("[node-") and "trainer-launcher: error:" in line and "error: evidence:" not in line:
            errors.setdefault(line.split("]")[0].lstrip("["), line)
    assert "exit 3 (permanent, Failed)" in errors["node-1"]
    for pod in ("node-0", "node-2"):  # each pod says the same: task 1's exit 3 (or it was torn down first)
        assert pod not in errors or "(task 1)" in errors[pod] and "exit 3 (permanent, PeerFailed)" in errors[pod] \
            or "Terminated" in errors[pod], errors.get(pod)


def test_every_pod_stops_at_once_when_pod_0_vanishes(tmp_path, out):
    """Pod 0 SIGKILLed (its launcher, and with it its tracker and worker): pod 1's launcher loses
    the stop board without a word and stops its worker, retryably, though xgboost's collective
    has nothing to say while the workers sit between two collectives."""
    port = free_port()
    pods = [Job(launcher("xgboost", "--", "python", TRAIN), pod_env(out, pod, 2, port, BEHAVIOUR="sleep"),
                tmp_path, f"pod{pod}") for pod in (0, 1)]
    wait_for(lambda: len(reports(out)) == 2, timeout=120, what="both workers inside the collective")
    worker_1 = reports(out)[1]["pid"]
    pods[0].signal(signal.SIGKILL)
    assert pods[1].wait(60) == 138, pods[1].stderr
    message = pods[1].termination()
    assert (message["reason"], message["retryable"]) == ("PeerLost", True)
    assert "pod 0 went away without a word" in message["message"], message
    assert not alive(worker_1)


def test_a_failing_worker_inside_a_multi_worker_pod_is_named_with_its_error(tmp_path, out):
    port = free_port()
    job = Job(launcher("xgboost", "--", "python", TRAIN),
              pod_env(out, 0, 2, port, LAUNCHER_XGBOOST_WORKERS_PER_POD="2", BEHAVIOUR="raise", FAIL_TASK="1"),
              tmp_path)
    assert job.wait(300) == 1, job.stderr
    message = job.termination()
    assert message["rootCause"]["rank"] == 1 and message["rootCause"]["localRank"] == 1
    assert message["error"] == "ValueError: task 1 found a bad shard"
    assert "XGBoost worker (task 1)" in message["message"]
    traceback = job.stderr[job.stderr.index("Traceback"):]
    assert 'xgboost_train.py", line' in traceback  # it starts in the program, not in the runner
    assert 'xgboost/run.py", line' not in traceback and "runpy" not in traceback


def test_a_tracker_that_never_comes_up_ends_the_pod_with_138_naming_it(tmp_path, out):
    port = free_port()  # nothing listens there: pod 0 never started
    job = Job(launcher("xgboost", "--rendezvous-timeout", "2", "--", "python", TRAIN), pod_env(out, 1, 2, port),
              tmp_path)
    started: list[psutil.Process] = []
    # The worker starts before validation, so it is there for the whole 2 s wait.
    wait_for(lambda: started.extend(psutil.Process(job.pid).children(recursive=True)) or started,
             timeout=60, what="the pod's early-started worker")
    assert job.wait(120) == 138, job.stderr
    message = job.termination()
    assert (message["reason"], message["retryable"]) == ("RendezvousTimeout", True)
    assert "XGBoost tracker" in message["message"] and f"127.0.0.1:{port}" in message["message"]
    assert not [p.pid for p in started if alive(p.pid)]  # its early-started worker went with it


def test_a_worker_that_cannot_join_the_tracker_exits_138_reporting_a_lost_peer(tmp_path, out):
    """The runner by hand, its tracker gone (it went away after the launcher saw it listen): it
    never runs the program, exits 138 (transient) and reports a lost peer naming its task, so its
    launcher waits for the board to name the root cause instead of taking this for one."""
    from launcher.runner import report as records

    report = tmp_path / "report.json"
    variables = pod_env(out, 1, 2, free_port())  # nothing listens there
    result = subprocess.run([sys.executable, str(REPO / "launcher" / "xgboost" / "run.py"), "--report", str(report),
                             "-c", "print('the program ran')"], cwd=tmp_path, env=variables, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 138, result.stderr
    assert "the program ran" not in result.stdout
    got = records.Report.read(str(report))
    assert got is not None and (got.ending, got.exit_code, got.rank) == ("peerLost", 138, 1), report.read_text()
    assert got.error is not None and got.error.startswith("could not join the tracker: ")


def test_workers_that_never_all_join_end_the_tracker_pod_with_138(tmp_path, out):
    port = free_port()  # pod 1 of 2 never starts
    # The same deadline bounds the tracker's own start (its xgboost import): 3 s was too short for it
    # on a machine busy with the rest of the suite ("the tracker did not listen on port ... within 3s").
    job = Job(launcher("xgboost", "--rendezvous-timeout", "15", "--", "python", TRAIN), pod_env(out, 0, 2, port),
              tmp_path)
    assert job.wait(120) == 138, job.stderr
    message = job.termination()
    assert message["reason"] == "RendezvousTimeout"
    assert "did not join the tracker" in message["message"] and "DMLC_NUM_WORKER=2" in message["message"]


def test_sigterm_stops_tracker_and_workers_and_exits_143(tmp_path, out):
    port = free_port()
    job = Job(launcher("xgboost", "--", "python", TRAIN),
              pod_env(out, 0, 2, port, LAUNCHER_XGBOOST_WORKERS_PER_POD="2", BEHAVIOUR="sleep"), tmp_path)
    wait_for(lambda: len(reports(out)) == 2, timeout=120, what="both workers inside the collective")
    pids = [r["pid"] for r in reports(out).values()] + [p.pid for p in psutil.Process(job.pid).children(recursive=True)]
    job.signal(signal.SIGTERM)
    assert job.wait(60) == 143
    assert job.termination()["reason"] == "Terminated"
    assert not [pid for pid in pids if alive(pid)]


def test_a_program_that_asks_for_another_task_id_is_told_what_the_launcher_joined(tmp_path, out):
    port = free_port()
    code = ("from xgboost import collective as c\n"
            "with c.CommunicatorContext(dmlc_tracker_uri='127.0.0.1', dmlc_tracker_port=%d, dmlc_task_id='5'):\n"
            "    pass\n" % port)
    job = Job(launcher("xgboost", "--", "python", "-c", code), pod_env(out, 0, 1, port), tmp_path)
    assert job.wait(120) == 1, job.stderr
    error = job.termination()["error"]
    assert "as task 0" in error and "dmlc_task_id='5'" in error and "LAUNCHER_XGBOOST_TRACKER=program" in error


def test_a_program_with_no_collective_code_of_its_own_is_distributed(tmp_path, out):
    """CommunicatorContext() with no arguments, as a user would write it: joins the launcher's."""
    port = free_port()
    code = ("import numpy as np\nfrom xgboost import collective as c\n"
            "with c.CommunicatorContext():\n"
            "    total = c.allreduce(np.array([c.get_rank() + 1.0]), c.Op.SUM)\n"
            "open('%s/sum-%%d' %% c.get_rank(), 'w').write(str(total[0]))\n" % out)
    job = Job(launcher("xgboost", "--", "python", "-c", code),
              pod_env(out, 0, 3, port, LAUNCHER_XGBOOST_WORKERS_PER_POD="3"), tmp_path)
    assert job.wait(120) == 0, job.stderr
    assert sorted(p.read_text() for p in out.glob("sum-*")) == ["6.0"] * 3


@pytest.mark.parametrize("pod", [1, 0], ids=["worker", "tracker-pod"])
def test_a_python_without_xgboost_is_one_line_and_exit_2(tmp_path, out, pod):
    """One pod's image has no xgboost in the program's python: the image's fault, not the
    launcher's (it was a launcher bug, exit 70, and on pod 0 the tracker's traceback, exit 1): one
    line naming that python, a permanent exit, no traceback. On pod 0 the tracker, in that python,
    says it first."""
    import subprocess

    bare = tmp_path / "bare"  # an interpreter with nothing installed
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    port = free_port()
    pythons = {pod: str(bare / "bin" / "python"), 1 - pod: "python"}
    pods = [Job(launcher("xgboost", "--", pythons[i], TRAIN), pod_env(out, i, 2, port), tmp_path, f"pod{i}")
            for i in (0, 1)]
    assert pods[pod].wait(120) == 2, pods[pod].stderr
    message = pods[pod].termination()
    assert (message["reason"], message["retryable"]) == ("ConfigError", False), message
    assert f"{bare / 'bin' / 'python'} cannot import xgboost: ModuleNotFoundError" in message["message"], message
    assert "Traceback" not in pods[pod].stderr, pods[pod].stderr
    pods[1 - pod].signal(15)
    pods[1 - pod].wait(120)
