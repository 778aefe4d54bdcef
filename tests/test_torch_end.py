"""The end of a successful multi-node torch job is one ordered protocol (issue 23): every node
that is not the store's host says it is done with the store, then the host leaves; nobody dials
the store after its host left.

Seen with two podman containers: node 1 took 22 s instead of 8 and printed "[c10d] The client
socket has timed out after 5000ms while trying to connect to (<job>-node-0-0.<job>, 29500)"
twice, a TCPStore error and a C++ trace, then "the job succeeded". The store torchrun's
rendezvous serves lives as long as torchrun's own TCPStore object on the host: it went away the
moment torchrun returned there, while the other nodes still had the exit barrier's reply, the
rendezvous' shutdown and the launcher's peers channel (launcher.torch.peers) to go; each node
then spent seconds dialling a store that was gone.

Real launchers, torchrun agents and gloo ranks: two "nodes" on this machine with Trainer's PET_*
env, the program (tests/programs/ending.py) ending in the ways programs end.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import REPO, Job, clean_env, free_port, launcher

ENDING = str(REPO / "tests" / "programs" / "ending.py")

# What a good run must never print: torch's store errors and their C++ traces, the exit
# barrier's failure, a Python traceback.
NOISE = re.compile(r"client socket has timed out|TCPStore|frame #\d|Traceback|Connection reset|DistNetworkError|"
                   r"DistStoreError|Error waiting on exit barrier|Broken pipe")


def run_two_nodes(tmp_path: Path, nproc: int, **env: str) -> tuple[list[Job], int]:
    """Both nodes to their end (a node still running after 150 s is killed and fails the test);
    how many ranks finished their program."""
    report_dir = tmp_path / "ranks"
    report_dir.mkdir()
    port = free_port()
    nodes = {}
    for rank in (1, 0):  # the worker first, as a scheduler may well start it
        nodes[rank] = Job(launcher("torch", "--grace-period", "5", "--", ENDING), clean_env(
            PET_NNODES="2", PET_NPROC_PER_NODE=str(nproc), PET_NODE_RANK=str(rank), PET_MASTER_ADDR="127.0.0.1",
            PET_MASTER_PORT=str(port), HOSTNAME=f"te-node-0-{rank}", REPORT_DIR=str(report_dir), **env),
            tmp_path, f"node{rank}")
    jobs = [nodes[0], nodes[1]]
    for job in jobs:
        try:
            job.wait(150)
        except subprocess.TimeoutExpired:
            for each in jobs:
                each.process.kill()
            pytest.fail("a node did not end within 150 s\n" + _output(jobs))
    return jobs, len(list(report_dir.glob("*.end")))


def _output(jobs: list[Job]) -> str:
    return "\n".join(f"--- node {i}\n{job.stderr[-4000:]}" for i, job in enumerate(jobs))


@pytest.mark.parametrize("nproc, env", [
    (1, {}),
    (2, {"END_BARRIER": "1"}),
    (1, {"END_BARRIER": "1", "END_SLEEP": "1.5"}),
    (2, {"END_SLEEP": "0.7"}),
    (2, {"END_DESTROY": "0", "END_BARRIER": "1", "END_SLEEP": "1"}),
], ids=["plain", "barrier-2-ranks", "node1-late", "node1-late-2-ranks", "no-destroy-node1-late"])
def test_a_successful_two_node_job_ends_in_order_and_quietly(tmp_path, nproc, env):
    jobs, finished = run_two_nodes(tmp_path, nproc, **env)
    said = _output(jobs)
    assert [job.process.returncode for job in jobs] == [0, 0], said
    assert finished == 2 * nproc, said
    for job in jobs:
        assert not NOISE.search(job.stderr), said
        assert job.stderr.rstrip().endswith("trainer-launcher: the job succeeded"), said


# --- the protocol, in-process: two nodes' Peers over a real TCPStore ---------------------------

class _Node:
    """A node's connection to the store, recording when it says it is done (its last word)."""

    def __init__(self, store, done_after: float = 0.0, vanish: bool = False):
        self.store, self.done_after, self.vanish = store, done_after, vanish
        self.said_done: float | None = None

    def __getattr__(self, name):
        return getattr(self.store, name)

    def set(self, key, value):
        from launcher.torch.peers import PREFIX

        if key.startswith(PREFIX + "done/"):
            time.sleep(self.done_after)
            if self.vanish:
                return None  # published its outcome, then its pod was gone
            self.said_done = time.monotonic()
        return self.store.set(key, value)


def _store_and_peers(linger: float = 5.0):
    from datetime import timedelta

    from torch.distributed import TCPStore

    from launcher.torch.peers import PeerConfig, Peers

    port = free_port()
    server = TCPStore("127.0.0.1", port, None, True, timedelta(seconds=10), wait_for_workers=False)
    nodes = []
    for rank in (0, 1):
        peers = Peers(PeerConfig("127.0.0.1", port, 2, rank, f"n{rank}", linger), on_stop=lambda record: None)
        peers.serves_store = lambda rank=rank: rank == 0
        nodes.append(peers)
    return server, nodes


def _conclude_both(nodes) -> tuple[list, list[float]]:
    import threading

    results, returned = [None, None], [0.0, 0.0]

    def conclude(i: int) -> None:
        results[i] = nodes[i].conclude({"exitCode": 0})
        returned[i] = time.monotonic()

    threads = [threading.Thread(target=conclude, args=(i,)) for i in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results, returned


def test_the_store_host_returns_only_after_the_other_node_said_its_last_word():
    server, nodes = _store_and_peers()
    other = nodes[1]._main_store()
    nodes[1]._store = node = _Node(other, done_after=1.0)
    (host_saw, other_saw), (host_left, _) = _conclude_both(nodes)
    assert [s["nodeRank"] for s in host_saw] == [0, 1] and [s["nodeRank"] for s in other_saw] == [0, 1]
    assert node.said_done is not None and host_left >= node.said_done


def test_a_node_that_published_then_vanished_holds_the_host_for_a_bounded_time(monkeypatch):
    from launcher.torch import peers

    monkeypatch.setattr(peers, "DONE_WAIT", 1.0)
    server, nodes = _store_and_peers()
    nodes[1]._store = _Node(nodes[1]._main_store(), vanish=True)
    started = time.monotonic()
    (host_saw, _), (host_left, _) = _conclude_both(nodes)  # both return: the host gave up waiting
    assert [s["nodeRank"] for s in host_saw] == [0, 1]
    assert host_left - started >= 1.0  # it did wait for the node's last word, DONE_WAIT long


def test_the_host_does_not_wait_for_a_node_that_never_published(monkeypatch):
    import threading

    from launcher.torch import peers

    monkeypatch.setattr(peers, "DONE_WAIT", 3600.0)  # were it waited for, conclude would not return
    server, nodes = _store_and_peers(linger=1.0)
    saw = []
    concluding = threading.Thread(target=lambda: saw.extend(nodes[0].conclude({"exitCode": 0})), daemon=True)
    concluding.start()
    concluding.join(120)
    assert not concluding.is_alive(), "the host waited for the last word of a node that never published"
    assert [s["nodeRank"] for s in saw] == [0]


def test_a_node_that_cannot_reach_the_store_at_its_end_concludes_alone_and_says_why(capfd):
    # The store's host is gone (its server closed) when this node concludes: it returns its own
    # outcome only, and its log says the others' are unknown here, not that they were lost.
    server, nodes = _store_and_peers()
    other = nodes[1]._main_store()
    del server, other
    saw = nodes[1].conclude({"exitCode": 3})
    assert [s["nodeRank"] for s in saw] == [1]
    said = [line for line in capfd.readouterr().err.splitlines() if "concludes on its own" in line]
    assert len(said) == 1 and "the other nodes' outcomes could not be read" in said[0], said
    assert "127.0.0.1:" in said[0] and "n1 concludes on its own" in said[0]


def test_a_node_says_its_last_word_only_once_its_watcher_is_done_with_the_store():
    import threading

    server, nodes = _store_and_peers()
    nodes[1]._store = node = _Node(nodes[1]._main_store())
    nodes[1]._watcher_idle.clear()  # the watcher is, say, answering a stacks request
    idle_at = []

    def watcher_done() -> None:
        time.sleep(1.0)
        idle_at.append(time.monotonic())
        nodes[1]._watcher_idle.set()

    threading.Thread(target=watcher_done).start()
    (host_saw, _), (host_left, _) = _conclude_both(nodes)
    assert node.said_done is not None and node.said_done >= idle_at[0] and host_left >= node.said_done


# --- the hook that keeps torchrun's store (torch/compat.py) -----------------------------------

def test_torchruns_store_is_kept_after_each_rendezvous(monkeypatch):
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent

    from launcher.torch import compat

    def rendezvous(self, worker_group):
        self._store = ("store of", worker_group)

    monkeypatch.setattr(SimpleElasticAgent, "_rendezvous", rendezvous)  # restored after the test
    kept = []
    assert compat.keep_rendezvous_store(kept.append)
    agent = SimpleNamespace()
    SimpleElasticAgent._rendezvous(agent, "group")
    assert kept == [("store of", "group")]
    # An agent that keeps no store still says it is through: the peers' watcher waits for that.
    monkeypatch.setattr(SimpleElasticAgent, "_rendezvous", lambda self, group: None)
    assert compat.keep_rendezvous_store(kept.append)
    SimpleElasticAgent._rendezvous(SimpleNamespace(), "group")
    assert kept == [("store of", "group"), None]


def test_without_a_rendezvous_to_wrap_keeping_the_store_is_off_said_once(monkeypatch, capfd):
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent

    from launcher.torch import compat

    monkeypatch.delattr(SimpleElasticAgent, "_rendezvous")
    monkeypatch.setattr(compat.notes, "said", set())
    assert compat.keep_rendezvous_store([].append) is False
    assert compat.keep_rendezvous_store([].append) is False
    off = [line for line in capfd.readouterr().err.splitlines() if "is off" in line]
    assert len(off) == 1 and "keeping the job's store up until every node is done with it is off" in off[0]


def test_the_node_serving_a_port_is_told_apart():
    import socket

    from launcher.torch import compat

    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        assert compat.serves_port(listening.getsockname()[1]) is True
        assert compat.serves_port(free_port()) is False
