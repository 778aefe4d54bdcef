"""The job's lobby (launcher/core/lobby.py): where the pods of a job that restarts in place agree on
the generation they start, so that a replaced pod finds the one the others hold for.

Each pod's side runs on a thread of this process, over real TCP sockets on loopback; pod 0's lobby
is a real server. The lifecycle's use of it, with real launchers, ranks and a pod SIGKILLed and
replaced, is in tests/test_restarts.py (torch), test_jax_restarts.py and test_xgboost_restarts.py.
"""

from __future__ import annotations

import errno
import socket
import threading
import time

import pytest
from conftest import free_port

from launcher.core.lobby import Lobby, Missing, Place
from launcher.core.reasons import Reasons

_RESET = {errno.ENOTCONN, errno.EPIPE, errno.ECONNRESET}

NAMES = ("tj-node-0-0", "tj-node-0-1", "tj-node-0-2")


def _lobby(port: int, rank: int, nnodes: int = 2) -> Lobby:
    lobby = Lobby(Place("127.0.0.1", port, nnodes, rank), NAMES[rank])
    lobby.serve()
    return lobby


class _CheckIn(threading.Thread):
    """One pod's check-in, on a thread: its agreed generation, or its error."""

    def __init__(self, lobby: Lobby, generation: int, timeout: float = 60.0, restarting: bool = False):
        super().__init__(daemon=True)
        self.lobby, self.generation, self.restarting = lobby, generation, restarting
        self.timeout = timeout
        self.agreed: int | None = None
        self.error: Exception | None = None
        self.start()

    def run(self) -> None:
        try:
            self.agreed = self.lobby.agree(self.generation, self.timeout, time.sleep, self.restarting)
        except Exception as error:  # noqa: BLE001 - the test reads it
            self.error = error

    def result(self) -> int | None:
        self.join(90)
        assert not self.is_alive(), "the check-in never ended"
        if self.error is not None:
            raise self.error
        return self.agreed


def test_every_pod_waits_for_every_other_at_the_same_generation():
    port = free_port()
    pods = [_lobby(port, rank, nnodes=3) for rank in range(3)]
    try:
        first = [_CheckIn(pods[0], 0), _CheckIn(pods[1], 0)]
        time.sleep(0.5)  # not a wait on a condition: time in which nothing may happen
        assert all(check.is_alive() for check in first), "a pod went before every pod checked in"
        last = _CheckIn(pods[2], 0)
        assert [check.result() for check in (*first, last)] == [0, 0, 0]
    finally:
        for pod in pods:
            pod.close()


def test_a_replaced_worker_pod_jumps_to_the_generation_the_others_hold_for():
    port = free_port()
    zero, replaced = _lobby(port, 0), _lobby(port, 1)
    try:
        holding = _CheckIn(zero, 2, restarting=True)
        assert _CheckIn(replaced, 0).result() == 2  # behind: told the job's generation, not let go
        assert holding.is_alive()
        assert _CheckIn(replaced, 2).result() == 2
        assert holding.result() == 2
    finally:
        zero.close()


def test_a_replaced_pod_0_serves_a_new_lobby_where_the_others_bring_their_generation():
    """The pod that remains checks in while nobody serves the lobby (pod 0 is gone), and keeps
    trying; the replacement's new lobby hears its generation, and the replacement jumps to it."""
    port = free_port()
    worker = Lobby(Place("127.0.0.1", port, 2, 1), NAMES[1])
    holding = _CheckIn(worker, 1, restarting=True)
    time.sleep(1.0)  # the worker finds nobody serving meanwhile
    assert holding.is_alive()
    replaced = _lobby(port, 0)
    try:
        jumped = _CheckIn(replaced, 0).result()
        assert jumped == 1
        assert _CheckIn(replaced, 1).result() == 1
        assert holding.result() == 1
    finally:
        replaced.close()


def test_a_lost_pod_that_never_comes_back_is_peer_lost_by_name_after_the_timeout():
    port = free_port()
    zero, worker = _lobby(port, 0), _lobby(port, 1)
    try:
        both = [_CheckIn(zero, 0), _CheckIn(worker, 0)]
        assert [check.result() for check in both] == [0, 0]
        with pytest.raises(Missing) as raised:
            _CheckIn(zero, 1, timeout=1.0, restarting=True).result()  # pod 1 was lost: never checks in again
        outcome = raised.value.outcome()
        assert (outcome.reason, outcome.exit_code, outcome.root_cause.node) == (Reasons.PEER_LOST, 138, NAMES[1])
        assert "tj-node-0-1 did not come back to rejoin the job within 1s (LAUNCHER_REJOIN_TIMEOUT)" in outcome.message
    finally:
        zero.close()


def test_a_pod_0_that_never_comes_back_is_named_by_its_address():
    worker = Lobby(Place("127.0.0.1", free_port(), 2, 1), NAMES[1])
    with pytest.raises(Missing) as raised:
        _CheckIn(worker, 1, timeout=1.0, restarting=True).result()
    outcome = raised.value.outcome()
    assert (outcome.reason, outcome.root_cause.node) == (Reasons.PEER_LOST, "127.0.0.1")
    assert outcome.message.startswith("pod 0 (serving the job's lobby at 127.0.0.1:")


def test_on_the_first_start_a_pod_that_never_came_is_a_rendezvous_timeout():
    port = free_port()
    zero = _lobby(port, 0)
    try:
        with pytest.raises(Missing) as raised:
            _CheckIn(zero, 0, timeout=1.0).result()
        outcome = raised.value.outcome()
        assert (outcome.reason, outcome.exit_code) == (Reasons.RENDEZVOUS_TIMEOUT, 138)
        assert "node rank 1 never checked in at the job's lobby" in outcome.message
    finally:
        zero.close()


def test_garbage_sent_to_the_lobby_is_dropped_and_it_serves_on():
    port = free_port()
    zero, worker = _lobby(port, 0), _lobby(port, 1)
    try:
        for junk in (b"GET / HTTP/1.1\r\n\r\n", b'{"rank": "x"}\n', b"\xff" * 5000, b""):
            with socket.create_connection(("127.0.0.1", port)) as conn:
                try:
                    conn.sendall(junk)
                    conn.shutdown(socket.SHUT_WR)
                    answer = conn.recv(100)
                except OSError as e:  # reset with our bytes unread (more than a line): ENOTCONN,
                    assert e.errno in _RESET, e  # EPIPE or ECONNRESET, whichever call meets it
                    answer = b""
                assert answer == b"", answer  # no answer: the connection closed
        both = [_CheckIn(zero, 0), _CheckIn(worker, 0)]
        assert [check.result() for check in both] == [0, 0]
    finally:
        zero.close()


def test_a_replacement_that_comes_while_the_generation_runs_is_told_the_next_one():
    """The others have not noticed the loss yet: their generation 0 still runs. The new launcher for
    node rank 1 (an id the lobby has not seen for it) waits for generation 1, which the others
    start once they lose its predecessor; the one it replaces, asking again, was not lost."""
    port = free_port()
    zero, worker = _lobby(port, 0), _lobby(port, 1)
    try:
        assert [check.result() for check in (_CheckIn(zero, 0), _CheckIn(worker, 0))] == [0, 0]
        replacement = _lobby(port, 1)
        assert _CheckIn(replacement, 0).result() == 1  # not let into the generation that runs
        waiting = _CheckIn(replacement, 1)
        assert _CheckIn(zero, 1, restarting=True).result() == 1  # the others restart: all meet at 1
        assert waiting.result() == 1
    finally:
        zero.close()


def test_the_same_launcher_asking_again_for_the_generation_that_runs_is_let_through():
    port = free_port()
    zero, worker = _lobby(port, 0), _lobby(port, 1)
    try:
        assert [check.result() for check in (_CheckIn(zero, 0), _CheckIn(worker, 0))] == [0, 0]
        assert _CheckIn(worker, 0).result() == 0  # a late look of a pod already in: no new generation
    finally:
        zero.close()
