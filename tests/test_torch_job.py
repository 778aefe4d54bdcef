"""`trainer-launcher torch` and `local` with real torchrun, real gloo ranks and real signals."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from conftest import IS_ROOT, RANKS, REPO, Job, alive, clean_env, free_port, launcher, rank_reports, wait_for


def start_node(tmp_path: Path, report_dir: Path, rank: int, nnodes: int, port: int, name: str | None = None, **env: str) -> Job:
    base = clean_env(
        PET_NNODES=str(nnodes), PET_NPROC_PER_NODE="2", PET_NODE_RANK=str(rank),
        PET_MASTER_ADDR="127.0.0.1", PET_MASTER_PORT=str(port), REPORT_DIR=str(report_dir), **env,
    )
    return Job(launcher("torch", "--", RANKS), base, tmp_path, name or f"node{rank}")


def single_node(tmp_path: Path, report_dir: Path, *options: str, **env: str) -> Job:
    base = clean_env(PET_NPROC_PER_NODE="2", REPORT_DIR=str(report_dir), **env)
    return Job(launcher("torch", *options, "--", RANKS), base, tmp_path)


def wait_ready(report_dir: Path, ranks: int) -> dict[int, dict]:
    wait_for(lambda: len(rank_reports(report_dir)) == ranks, what=f"{ranks} ranks to be ready")
    return rank_reports(report_dir)


def test_two_torch_nodes_with_hand_made_pet_env_form_one_four_rank_world(tmp_path, report_dir):
    port = free_port()
    nodes = [start_node(tmp_path, report_dir, rank, 2, port) for rank in (1, 0)]  # the worker first
    assert [node.wait() for node in nodes] == [0, 0], nodes[0].stderr + nodes[1].stderr
    reports = rank_reports(report_dir)
    assert sorted(reports) == [0, 1, 2, 3]
    for rank, report in reports.items():
        assert report["world_size"] == 4
        assert report["group_rank"] == rank // 2  # the node rank
        assert report["local_rank"] == rank % 2
        assert report["local_world_size"] == 2
        assert report["allreduce"] == 1 + 2 + 3 + 4
    assert "static rendezvous, node 1 of 2" in nodes[0].stderr


def test_two_nodes_with_c10d_rendezvous_asked_for_by_env_form_one_world(tmp_path, report_dir):
    port = free_port()
    nodes = [start_node(tmp_path, report_dir, rank, 2, port, PET_RDZV_BACKEND="c10d") for rank in (1, 0)]
    assert [node.wait() for node in nodes] == [0, 0], nodes[0].stderr + nodes[1].stderr
    reports = rank_reports(report_dir)
    assert sorted(reports) == [0, 1, 2, 3]
    assert {r["allreduce"] for r in reports.values()} == {10.0}
    assert "c10d rendezvous" in nodes[0].stderr


def test_local_emulates_a_two_node_trainjob_with_prefixed_output(tmp_path, report_dir):
    job = Job(launcher("local", "--nnodes", "2", "--nproc-per-node", "2", "--", RANKS),
              clean_env(REPORT_DIR=str(report_dir)), tmp_path)
    assert job.wait() == 0, job.stderr
    reports = rank_reports(report_dir)
    assert sorted(reports) == [0, 1, 2, 3]
    assert {r["allreduce"] for r in reports.values()} == {10.0}
    assert {r["group_rank"] for r in reports.values()} == {0, 1}
    assert "[node-1 rank-3] rank 3 ready" in job.stdout
    assert "[node-0] trainer-launcher: torch: static rendezvous, node 0 of 2" in job.stderr
    if IS_ROOT:  # each node is a pod: its own hostname, the master reached by the controller's DNS name
        assert {r["hostname"] for r in reports.values()} == {"local-node-0-0", "local-node-0-1"}
        assert "master local-node-0-0.local:" in job.stderr


@pytest.mark.parametrize(
    ("behaviour", "exit_code", "retryable", "reason", "signal_name"),
    [
        ("exit:3", 3, False, "Failed", None),
        ("kill:SIGKILL", 137, True, "Killed", "SIGKILL"),
        ("kill:SIGSEGV", 139, False, "Crashed", "SIGSEGV"),
        ("exit:138", 138, True, "RetryableExit", None),
        ("nccl-error", 138, True, "NodeFault", "SIGABRT"),
    ],
    ids=["exit-3", "sigkill", "sigsegv", "user-retryable-138", "nccl-watchdog-text"],
)
def test_the_root_cause_rank_decides_the_exit_code(tmp_path, report_dir, behaviour, exit_code, retryable, reason, signal_name):
    job = single_node(tmp_path, report_dir, BEHAVIOUR=behaviour, FAIL_RANK="1")
    assert job.wait() == exit_code, job.stderr
    message = job.termination()
    assert message["exitCode"] == exit_code
    assert message["retryable"] is retryable
    assert message["reason"] == reason
    assert message["rootCause"]["rank"] == 1
    assert message["rootCause"]["localRank"] == 1
    assert message["rootCause"]["signal"] == signal_name
    assert message["rootCause"]["node"]
    if reason == "NodeFault":
        assert "Watchdog caught collective operation timeout" in message["evidence"]
    assert len(job.termination_log.read_bytes()) <= 4096


def test_a_rank_the_nccl_watchdog_aborts_on_a_cuda_error_names_that_error(tmp_path, report_dir):
    """No GPU here: rank 1 replays what a rank printed on an H200 (tests/gpu/checks.sh, a
    device-side assert under NCCL: the watchdog's "what():" line, then C++ stack frames) and
    aborts. The termination message names the CUDA error; its last lines skip the frames."""
    capture = Path(__file__).parent / "fixtures" / "nccl_watchdog_abort.txt"
    job = single_node(tmp_path, report_dir, BEHAVIOUR="replay-abort", FAIL_RANK="1", ABORT_TEXT=str(capture))
    assert job.wait() == 134, job.stderr
    message = job.termination()
    assert (message["reason"], message["retryable"], message["rootCause"]["signal"]) == ("Signaled", False, "SIGABRT")
    assert message["error"].endswith("Process group watchdog thread terminated with exception: CUDA error: "
                                      "device-side assert triggered")
    assert message["lastLines"] and not [line for line in message["lastLines"] if "frame #" in line]
    assert "For debugging consider passing CUDA_LAUNCH_BLOCKING=1" in message["lastLines"]


def test_sigterm_to_the_launcher_stops_every_rank_and_exits_143(tmp_path, report_dir):
    job = single_node(tmp_path, report_dir, BEHAVIOUR="sleep")
    pids = [r["pid"] for r in wait_ready(report_dir, 2).values()]
    job.signal(signal.SIGTERM)
    assert job.wait(60) == 143
    assert not [pid for pid in pids if alive(pid)]
    assert job.termination()["reason"] == "Terminated"
    assert job.termination()["retryable"] is True


def test_a_rank_that_ignores_sigterm_is_killed_after_the_grace_period_not_torchruns_30s(tmp_path, report_dir):
    job = single_node(tmp_path, report_dir, "--grace-period", "2", BEHAVIOUR="ignore-term", FAIL_RANK="1")
    pids = [r["pid"] for r in wait_ready(report_dir, 2).values()]
    job.signal(signal.SIGTERM)
    assert job.wait(25) == 143  # torchrun alone would wait 30 s before its SIGKILL
    assert not [pid for pid in pids if alive(pid)]


def test_sigkill_to_the_launcher_leaves_no_rank_alive(tmp_path, report_dir):
    job = single_node(tmp_path, report_dir, BEHAVIOUR="sleep")
    pids = [r["pid"] for r in wait_ready(report_dir, 2).values()]
    job.signal(signal.SIGKILL)
    job.wait(10)
    wait_for(lambda: not any(alive(pid) for pid in pids), timeout=10, what="the ranks to die with the launcher")


def test_sigusr1_reaches_every_rank_and_the_job_keeps_running(tmp_path, report_dir):
    job = single_node(tmp_path, report_dir, BEHAVIOUR="usr1")
    wait_ready(report_dir, 2)
    job.signal(signal.SIGUSR1)
    wait_for(lambda: {p.name for p in report_dir.glob("*.usr1")} == {"0.usr1", "1.usr1"}, timeout=10, what="SIGUSR1 in both ranks")
    assert job.process.poll() is None
    job.signal(signal.SIGTERM)
    assert job.wait(60) == 143


def test_the_launcher_process_itself_never_loads_torch(tmp_path, report_dir):
    job = single_node(tmp_path, report_dir, BEHAVIOUR="sleep")
    wait_ready(report_dir, 2)
    maps = Path(f"/proc/{job.pid}/maps").read_text()
    job.signal(signal.SIGTERM)
    job.wait(60)
    assert "libtorch" not in maps


def test_local_first_failure_tears_down_every_node_and_names_the_failing_node(tmp_path, report_dir):
    job = Job(launcher("local", "--nnodes", "2", "--nproc-per-node", "2", "--", RANKS),
              clean_env(REPORT_DIR=str(report_dir), BEHAVIOUR="exit:3", FAIL_RANK="3"), tmp_path)
    assert job.wait(120) == 3, job.stderr
    message = job.termination()
    assert message["rootCause"]["rank"] == 3
    assert message["rootCause"]["localRank"] == 1
    assert message["rootCause"]["node"] == "local-node-0-1"
    pids = [r["pid"] for r in rank_reports(report_dir).values()]
    assert len(pids) == 4 and not [pid for pid in pids if alive(pid)]


def test_sigterm_to_local_stops_every_node(tmp_path, report_dir):
    job = Job(launcher("local", "--nnodes", "2", "--nproc-per-node", "1", "--", RANKS),
              clean_env(REPORT_DIR=str(report_dir), BEHAVIOUR="sleep"), tmp_path)
    pids = [r["pid"] for r in wait_ready(report_dir, 2).values()]
    job.signal(signal.SIGTERM)
    assert job.wait(60) == 143
    assert not [pid for pid in pids if alive(pid)]


def test_a_rank_that_records_its_error_has_it_in_the_termination_message(tmp_path):
    """torch's own @record writes the exception to torchrun's error file: its words, not the
    file's JSON, become the termination message's error."""
    program = REPO / "tests" / "programs" / "recorded.py"
    job = Job(launcher("torch", "--", "--standalone", "--nproc-per-node", "2", str(program)), clean_env(), tmp_path)
    assert job.wait() == 1, job.stderr
    message = job.termination()
    assert message["rootCause"]["rank"] == 1
    assert message["error"] == "ValueError: loss is nan at step 7"
