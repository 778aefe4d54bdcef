"""The launcher as PID 1 of a real PID namespace (unshare --pid --fork --mount-proc), as in a container."""

from __future__ import annotations

import signal

import psutil

from conftest import RANKS, Job, clean_env, launcher, needs_root, rank_reports, wait_for

pytestmark = needs_root


def in_pid_namespace(*argv: str) -> list[str]:
    return ["unshare", "--pid", "--fork", "--mount-proc", *argv]


def launcher_in(job: Job) -> int:
    """The launcher's pid as seen from outside: the child of `unshare --fork`."""
    wait_for(lambda: psutil.Process(job.pid).children(), timeout=10, what="unshare to fork")
    return psutil.Process(job.pid).children()[0].pid


def test_pid1_reaps_orphaned_grandchildren(tmp_path):
    listing = tmp_path / "ps.txt"
    # Each `( sleep & )` orphans a sleep that reparents to PID 1; once they exit, only a reaping
    # PID 1 keeps them from lingering as zombies.
    command = f"for i in 1 2 3 4 5; do ( sleep 0.2 & ); done; sleep 1.5; ps -eo pid,stat,comm > {listing}"
    job = Job(in_pid_namespace(*launcher("exec", "--", "sh", "-c", command)), clean_env(), tmp_path)
    assert job.wait(30) == 0, job.stderr
    rows = [line.split(None, 2) for line in listing.read_text().splitlines()[1:]]
    assert any(pid == "1" and comm.startswith("python") for pid, _, comm in rows)  # the launcher is PID 1
    assert not [row for row in rows if row[1].startswith("Z")], listing.read_text()


def test_pid1_forwards_signals_to_every_rank_and_stops_them_all(tmp_path, report_dir):
    env = clean_env(PET_NPROC_PER_NODE="2", REPORT_DIR=str(report_dir), BEHAVIOUR="usr1")
    job = Job(in_pid_namespace(*launcher("torch", "--", RANKS)), env, tmp_path)
    wait_for(lambda: len(rank_reports(report_dir)) == 2, what="two ranks")
    pid1 = launcher_in(job)
    psutil.Process(pid1).send_signal(signal.SIGUSR1)
    wait_for(lambda: len(list(report_dir.glob("*.usr1"))) == 2, timeout=10, what="SIGUSR1 in both ranks")
    psutil.Process(pid1).send_signal(signal.SIGTERM)
    assert job.wait(60) == 143, job.stderr
    assert job.termination()["reason"] == "Terminated"


def test_pid1_exits_with_the_failing_ranks_code(tmp_path, report_dir):
    env = clean_env(PET_NPROC_PER_NODE="2", REPORT_DIR=str(report_dir), BEHAVIOUR="exit:5", FAIL_RANK="0")
    job = Job(in_pid_namespace(*launcher("torch", "--", RANKS)), env, tmp_path)
    assert job.wait(120) == 5, job.stderr
    assert job.termination()["rootCause"]["rank"] == 0
