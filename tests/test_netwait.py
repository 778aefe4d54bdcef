"""Waiting for the master's DNS name and port, as a pod that starts before its peers must.

Names live in a private /etc/hosts (and a resolv.conf pointing at loopback) bind-mounted in a
mount namespace, so the test controls when a name starts to resolve without touching the machine.
"""

from __future__ import annotations


from conftest import RANKS, Job, clean_env, free_port, launcher, needs_root, rank_reports, wait_for, with_private_names

@needs_root
def test_a_master_name_that_resolves_late_still_starts_the_job(tmp_path, report_dir):
    argv, hosts = with_private_names(tmp_path, launcher("torch", "--", RANKS))
    env = clean_env(PET_NNODES="1", PET_NPROC_PER_NODE="1", PET_MASTER_ADDR="late-master.tj",
                    PET_MASTER_PORT=str(free_port()), REPORT_DIR=str(report_dir))
    job = Job(argv, env, tmp_path)
    wait_for(lambda: "waiting for late-master.tj to resolve" in job.stderr, what="the launcher to wait for the name")
    with open(hosts, "a") as handle:  # same inode: the bind mount sees it
        handle.write("127.0.0.1 late-master.tj\n")
    assert job.wait(120) == 0, job.stderr
    assert len(rank_reports(report_dir)) == 1


@needs_root
def test_a_master_name_that_never_resolves_is_retryable_138_naming_it(tmp_path):
    argv, _ = with_private_names(tmp_path, launcher("torch", "--rendezvous-timeout", "2", "--", RANKS))
    env = clean_env(PET_NNODES="2", PET_NODE_RANK="1", PET_MASTER_ADDR="never-master.tj")
    job = Job(argv, env, tmp_path)
    assert job.wait(60) == 138
    message = job.termination()
    assert message["retryable"] is True
    assert message["reason"] == "RendezvousTimeout"
    assert "never-master.tj" in message["message"]


def test_a_worker_started_before_the_master_waits_for_its_port(tmp_path, report_dir):
    port = free_port()
    env = dict(PET_NNODES="2", PET_NPROC_PER_NODE="1", PET_MASTER_ADDR="127.0.0.1", PET_MASTER_PORT=str(port),
               REPORT_DIR=str(report_dir))
    worker = Job(launcher("torch", "--", RANKS), clean_env(PET_NODE_RANK="1", **env), tmp_path, "worker")
    wait_for(lambda: f"waiting for 127.0.0.1:{port} to accept connections" in worker.stderr, what="the worker to wait")
    master = Job(launcher("torch", "--", RANKS), clean_env(PET_NODE_RANK="0", **env), tmp_path, "master")
    assert (master.wait(), worker.wait()) == (0, 0), master.stderr + worker.stderr
    assert sorted(rank_reports(report_dir)) == [0, 1]


def test_a_master_port_that_never_opens_is_retryable_138_naming_it(tmp_path):
    port = free_port()
    env = clean_env(PET_NNODES="2", PET_NODE_RANK="1", PET_MASTER_ADDR="127.0.0.1", PET_MASTER_PORT=str(port))
    job = Job(launcher("torch", "--rendezvous-timeout", "2", "--", RANKS), env, tmp_path)
    assert job.wait(60) == 138
    assert f"127.0.0.1:{port} never accepted a connection" in job.termination()["message"]


def test_a_wait_of_thousands_of_short_knocks_ends_at_its_deadline_not_in_a_crash():
    # XGBoost's pods knock on pod 0's tracker every 0.2 s at most: a pod 0 pending for minutes (its
    # image still pulling) means thousands of tries, and the backoff once overflowed past 1024
    # (OverflowError: the launcher's own crash, exit 70, instead of waiting on).
    import socket
    import time

    from launcher.core import netwait
    from launcher.core.outcome import WaitTimeout

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, never listening: every knock is refused
        knocks = []
        try:
            netwait.wait_until_accepts("127.0.0.1", port, time.monotonic() + 3.0, knocks.append)
        except WaitTimeout as error:
            assert f"127.0.0.1:{port}" in str(error)
        else:
            raise AssertionError("a port that never listens was waited for successfully")
    assert len(knocks) > 1100  # the sleep was the caller's, and returned at once
