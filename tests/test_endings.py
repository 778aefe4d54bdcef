"""Every way a real program ends, and the verdict each pod gives it (issue 36: verdicts from evidence).

Real launchers, torchrun agents and gloo ranks in a training loop (tests/programs/endings.py): one
rank ends the way a row says while the others are mid-collective, so they always meet its end as
gloo's "Connection closed by peer". That echo is never evidence about the rank that failed first:
a native crash stays a crash, a SIGKILL stays a kill. The expected verdicts are those of the table
in docs/reference/exit-codes.md, which the last test reads back.

The OOM rows run the job in a cgroup v1 memory cgroup with a limit (as root), so the kernel's own
OOM killer takes the rank: nothing is simulated. The lost-pod rows SIGKILL a whole pod's process
group, as a lost machine or an eviction does.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import sys
from pathlib import Path

import pytest
from conftest import IS_ROOT, REPO, Job, clean_env, free_port, launcher, wait_for
from test_mpi import local_mpi, mpi, needs_cluster, shared_dir  # noqa: F401 - its fixtures, for the MPI rows

ENDINGS = str(REPO / "tests" / "programs" / "endings.py")

# ending -> (exit code, reason, retryable, the root cause's signal)
TABLE = {
    "exit:1": (1, "Failed", False, None),
    "exit:3": (3, "Failed", False, None),
    "exit:130": (130, "RetryableExit", True, None),
    "exit:138": (138, "RetryableExit", True, None),
    "exit:143": (143, "RetryableExit", True, None),
    "signal:SIGSEGV": (139, "Crashed", False, "SIGSEGV"),
    "signal:SIGBUS": (135, "Crashed", False, "SIGBUS"),
    "signal:SIGFPE": (136, "Crashed", False, "SIGFPE"),
    "signal:SIGILL": (132, "Crashed", False, "SIGILL"),
    "signal:SIGABRT": (134, "Signaled", False, "SIGABRT"),
    "signal:SIGKILL": (137, "Killed", True, "SIGKILL"),
    "fault": (138, "NodeFault", True, None),
}


def _pod(tmp_path: Path, node_rank: int, nnodes: int, nproc: int, port: int, **env: str) -> Job:
    return Job(
        launcher("torch", "--grace-period", "5", "--", ENDINGS),
        clean_env(PET_NNODES=str(nnodes), PET_NPROC_PER_NODE=str(nproc), PET_NODE_RANK=str(node_rank),
                  PET_MASTER_ADDR="127.0.0.1", PET_MASTER_PORT=str(port), HOSTNAME=f"end-node-0-{node_rank}", **env),
        tmp_path, f"node{node_rank}")


def _check(job: Job, ending: str, rank: int) -> None:
    code, reason, retryable, sig = TABLE[ending]
    assert job.wait(180) == code, job.stderr[-4000:]
    message = job.termination()
    assert (message["exitCode"], message.get("causeReason", message["reason"]), message["retryable"]) == (
        code, reason, retryable), message
    assert (message["rootCause"]["rank"], message["rootCause"]["signal"]) == (rank, sig), message
    if reason != "NodeFault":
        assert "evidence" not in message, message  # the peers' "Connection closed by peer" is no fault


@pytest.mark.parametrize("ending", list(TABLE))
def test_every_ending_of_a_rank_gets_the_tables_verdict_though_its_peers_echo_it(tmp_path, report_dir, ending):
    job = _pod(tmp_path, 0, 1, 2, free_port(), ENDING=ending, FAIL_RANK="1", REPORT_DIR=str(report_dir))
    _check(job, ending, 1)


# New draws each run, the same in every pytest-xdist worker of one run (they must collect alike);
# ENDINGS_SEED replays a run's draws.
_DRAWS = random.Random(os.environ.get("ENDINGS_SEED") or os.environ.get("PYTEST_XDIST_TESTRUNUID") or None)


@pytest.mark.parametrize("seed", [_DRAWS.randrange(10**6) for _ in range(3)])
def test_a_random_ending_in_a_random_rank_at_a_random_step_is_the_same_verdict_on_every_pod(tmp_path, report_dir, seed):
    """The property: whatever ends, wherever and whenever, every pod of a 2 x 2 job exits with the
    table's code and names that rank as the root cause. The seed is in the test's id."""
    draw = random.Random(seed)
    ending, rank, step = draw.choice(sorted(TABLE)), draw.randrange(4), draw.randrange(1, 20)
    port = free_port()
    jobs = [_pod(tmp_path, node, 2, 2, port, ENDING=ending, FAIL_RANK=str(rank), AT_STEP=str(step),
                 REPORT_DIR=str(report_dir)) for node in (1, 0)]
    for job in jobs:
        _check(job, ending, rank)


def _memory_cgroup(tmp_path: Path, limit: int) -> Path:
    root = Path("/sys/fs/cgroup/memory")
    if not IS_ROOT or not (root / "memory.oom_control").exists():
        pytest.skip("needs root and cgroup v1's memory controller, to run the job under a memory limit")
    group = root / f"trainer-launcher-test-{os.getpid()}-{tmp_path.name}"
    group.mkdir()
    (group / "memory.limit_in_bytes").write_text(str(limit))
    swap = group / "memory.memsw.limit_in_bytes"
    if swap.exists():
        swap.write_text(str(limit))  # no swap to hide in: the limit is what the kernel enforces
    return group


def _in_cgroup(group: Path, argv: list[str]) -> list[str]:
    return ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(group), *argv]


@pytest.fixture
def memory_limit(tmp_path):
    groups = []

    def make(limit: int) -> Path:
        groups.append(_memory_cgroup(tmp_path, limit))
        return groups[-1]

    yield make
    for group in groups:  # a cgroup is removed once its last process has gone
        wait_for(lambda group=group: not (group / "cgroup.procs").read_text().strip(), 30, "the cgroup to empty")
        group.rmdir()


def test_a_rank_the_kernels_oom_killer_takes_is_named_with_the_containers_limit(tmp_path, report_dir, memory_limit):
    group = memory_limit(3 << 30)
    env = clean_env(PET_NPROC_PER_NODE="2", ENDING="oom", FAIL_RANK="1", REPORT_DIR=str(report_dir))
    job = Job(_in_cgroup(group, launcher("torch", "--", ENDINGS)), env, tmp_path)
    assert job.wait(180) == 137, job.stderr[-4000:]
    message = job.termination()
    assert (message["reason"], message["retryable"], message["rootCause"]["rank"]) == ("OutOfMemory", True, 1)
    assert "rank 1 (local rank 1)" in message["message"], message
    assert "killed by the kernel's OOM killer; the container's memory limit is 3 GiB" in message["message"]


def test_a_command_the_oom_killer_takes_is_out_of_memory_and_a_plain_sigkill_is_not(tmp_path, memory_limit):
    group = memory_limit(256 << 20)
    hog = "b = []\nwhile True: b.append(bytearray(b'1') * (16 << 20))"
    job = Job(_in_cgroup(group, launcher("exec", "--", "python3", "-c", hog)), clean_env(), tmp_path, "hog")
    assert job.wait(120) == 137, job.stderr
    assert job.termination()["reason"] == "OutOfMemory"
    assert "the container's memory limit is 256 MiB" in job.termination()["message"]
    # In the same cgroup, after that kill: a SIGKILL from anyone else is no OOM kill.
    killed = Job(_in_cgroup(group, launcher("exec", "--", "sh", "-c", "kill -KILL $$")), clean_env(), tmp_path, "kill")
    assert killed.wait(60) == 137, killed.stderr
    assert killed.termination()["reason"] == "Killed"


@pytest.mark.parametrize("lost", [1, 0], ids=["a-worker-pod", "the-store-host-pod"])
def test_a_lost_pod_is_peer_lost_and_retried_on_the_pods_that_remain(tmp_path, report_dir, lost):
    """Two pods as Trainer starts them; once they train, one pod's every process is SIGKILLed (a
    node failure, an eviction, a preemption). The survivor's ranks die of gloo's "Connection reset
    by peer": it exits 138 PeerLost, naming the lost pod, never its own rank as a permanent failure."""
    port = free_port()
    jobs = {}
    for node in (1, 0):
        jobs[node] = _pod(tmp_path, node, 2, 2, port, ENDING="none", STEPS="100000", REPORT_DIR=str(report_dir))
    wait_for(lambda: len(list(report_dir.glob("*.step"))) == 4, 120, "every rank to train")
    victim, survivor = jobs[lost], jobs[1 - lost]
    _kill_pod(victim)
    assert survivor.wait(120) == 138, survivor.stderr[-4000:]
    message = survivor.termination()
    assert (message["reason"], message["retryable"]) == ("PeerLost", True), message
    assert message["rootCause"]["node"] == f"end-node-0-{lost}", message
    assert "went away without a word" in message["message"]


def _kill_pod(job: Job) -> None:
    """SIGKILL the pod: the launcher, its agent and every rank (each rank in a group of its own)."""
    import psutil

    pod = psutil.Process(job.pid)
    everyone = [pod, *pod.children(recursive=True)]
    for process in everyone:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.send_signal(signal.SIGKILL)
    job.wait(30)


@pytest.mark.unit
def test_the_exit_code_pages_common_codes_are_the_verdicts_the_runs_give():
    """docs/reference/exit-codes.md's common codes are this file's table (the page is generated
    from launcher/core/reasons.py; the runs above check the launcher against the same rows)."""
    page = (REPO / "docs" / "reference" / "exit-codes.md").read_text()
    rows = dict(re.findall(r"^\| (exited \d+|killed by SIG\w+) \| (\d+ \| `\w+`)", page, re.M))
    assert rows, "no common codes on the page"
    for ending, (code, reason, _, sig) in TABLE.items():
        how = f"exited {ending.split(':')[1]}" if ending.startswith("exit:") else f"killed by {sig}"
        if how in rows:
            assert rows[how] == f"{code} | `{reason}`", (how, rows[how])


# --- the same rows for the other frameworks ---------------------------------------------------

JAX_FAIL = str(REPO / "tests" / "programs" / "jax_fail.py")
XGBOOST_TRAIN = str(REPO / "tests" / "programs" / "xgboost_train.py")
@pytest.mark.parametrize("ending", sorted(TABLE))
@pytest.mark.parametrize("framework", ["jax", "xgboost"])
def test_a_jax_or_xgboost_process_ending_so_gets_the_same_verdict_on_every_pod(tmp_path, framework, ending):
    """Two pods (``local``), process 1 ends while process 0 waits for it in a collective."""
    env = {k: v for k, v in clean_env().items() if not k.startswith(("JAX_", "DMLC_"))}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}"
    if framework == "jax":
        how = "exit" if ending.startswith("exit:") else ending
        env.update(FAIL_ID="1", FAIL_HOW=how, FAIL_CODE=ending.partition(":")[2])
        program = JAX_FAIL
    else:
        env.update(BEHAVIOUR=ending, FAIL_TASK="1", OUT_DIR=str(tmp_path))
        program = XGBOOST_TRAIN
    job = Job(launcher("local", "--framework", framework, "--nnodes", "2", "--", "python", program), env, tmp_path)
    _check(job, ending, 1)


@needs_cluster
@pytest.mark.parametrize("ending", ["signal:SIGSEGV", "signal:SIGKILL"])
def test_an_mpi_rank_a_signal_ends_is_named_with_it(mpi, tmp_path, shared_dir, ending):  # noqa: F811
    """mpirun exits with a code of its own for a rank a signal ended; the launcher reads which rank
    and which signal from what it says (Open MPI names both, Intel MPI the signal of a crash alone, and
    nothing of a SIGKILL, whose 137 it passes on; MPICH's hydra says "EXIT CODE: 11" for a SIGSEGV and
    for exit(11) alike)."""
    if mpi["name"] == "mpich":
        pytest.skip("hydra (MPICH) does not tell a signal from an exit code")
    job = local_mpi(mpi, tmp_path, shared_dir, nproc=1, BEHAVIOUR=ending, FAIL_RANK="1")
    code, reason, retryable, sig = TABLE[ending]
    assert job.wait(180) == code, job.stderr[-4000:]
    message = job.termination()
    if mpi["name"] == "intel" and sig == "SIGKILL":
        assert message["retryable"] is True, message
        return
    assert (message["reason"], message["retryable"], message["rootCause"]["signal"]) == (reason, retryable, sig)
    if mpi["library"].startswith("Open MPI"):
        assert message["rootCause"]["rank"] == 1 and message["rootCause"]["node"] == "local-node-0-1", message


def _runner_pod(tmp_path: Path, framework: str, index: int, port: int, report_dir: Path) -> Job:
    """Pod ``index`` of two, as Trainer starts a JAX or XGBoost pod, its program training until stopped."""
    env = {k: v for k, v in clean_env().items() if not k.startswith(("JAX_", "DMLC_"))}
    env["HOSTNAME"] = f"end-node-0-{index}"
    if framework == "jax":
        env.update(JAX_NUM_PROCESSES="2", JAX_PROCESS_ID=str(index), JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                   FAIL_HOW="train", REPORT_DIR=str(report_dir))
        program = JAX_FAIL
    else:
        env.update(DMLC_NUM_WORKER="2", DMLC_TASK_ID=str(index), DMLC_TRACKER_URI="127.0.0.1",
                   DMLC_TRACKER_PORT=str(port), ROUNDS="100000", OUT_DIR=str(report_dir))
        program = XGBOOST_TRAIN
    return Job(launcher(framework, "--", sys.executable, program), env, tmp_path, f"pod{index}")


@pytest.mark.parametrize("lost", [1, 0], ids=["a-worker-pod", "the-coordinator-pod"])
@pytest.mark.parametrize("framework", ["jax", "xgboost"])
def test_a_lost_jax_or_xgboost_pod_is_peer_lost_naming_it_on_the_pod_that_remains(tmp_path, report_dir, framework,
                                                                                   lost):
    """The lost-pod row for the runner frameworks: two pods train; one pod's every process is
    SIGKILLed. The other exits 138 PeerLost, naming the lost pod as the root cause."""
    port = free_port(span=2)  # XGBoost's stop board listens on the tracker's port + 1
    jobs = {index: _runner_pod(tmp_path, framework, index, port, report_dir) for index in (0, 1)}
    marks = "*.step" if framework == "jax" else "training-*"
    wait_for(lambda: len(list(report_dir.glob(marks))) == 2, 180, "both pods to train")
    _kill_pod(jobs[lost])
    survivor = jobs[1 - lost]
    assert survivor.wait(120) == 138, survivor.stderr[-4000:]
    message = survivor.termination()
    assert (message["reason"], message["retryable"]) == ("PeerLost", True), message
    assert message["rootCause"]["node"] == f"end-node-0-{lost}", message
    assert "went away without a word" in message["message"], message
