"""Stacks from ranks in other pods (workers that mpirun reaches over ssh), which the launcher cannot signal.

With hang detection on, a rank whose interpreter finds no stacks directory of the launcher's on
its own machine (see hook/_trainer_launcher_stacks.py) connects to this board instead, at the
address in :data:`BOARD_ENV`, and says who it is. The connection stays open and idle until a hang:
then :meth:`StackBoard.collect` asks each rank for its stacks, and a thread of the rank answers
with faulthandler's dump of all its threads.

A thread must take the GIL to answer, so a rank that holds it in a C call stays silent; ranks
in a collective (gloo, NCCL, mpi4py's) release it and answer. The signal path in
stacks.py serves the ranks on the launcher's own pod, which need no GIL.
"""

from __future__ import annotations

import json
import selectors
import socket
import threading
import time

from launcher.core.listener import TokenListener
from launcher.status.stacks import BOARD_ENV, RankStacks, by_rank, top_frames

_HELLO_LIMIT = 4096
_DUMP_LIMIT = 4 * 1024 * 1024  # faulthandler stops at 100 threads of 100 frames each


class _Rank:
    def __init__(self, connection: socket.socket, hello: dict):
        self.connection = connection
        self.pid = hello["pid"]
        self.rank = _number(hello.get("rank"))
        self.local_rank = _number(hello.get("localRank"))
        self.host = hello.get("host") if isinstance(hello.get("host"), str) else None
        self.main = _number(hello.get("main"))
        self.received = b""


class StackBoard(TokenListener):
    """Keeps each rank's connection while the job runs. ``env`` tells the ranks where it is."""

    def __init__(self, family: int, address: str):
        self._ranks: list[_Rank] = []
        self._lock = threading.Lock()
        super().__init__(family, address, BOARD_ENV, "stack-board")

    @property
    def connected(self) -> int:
        with self._lock:
            return len(self._ranks)

    def close(self) -> None:
        super().close()
        with self._lock:
            ranks, self._ranks = self._ranks, []
        for rank in ranks:
            rank.connection.close()

    def collect(self, wait: float = 3.0) -> list[RankStacks]:
        """Ask every connected rank for its stacks and wait (at most ``wait`` seconds) for the
        answers; ordered by rank. A rank that does not answer in time is left out."""
        deadline = time.monotonic() + wait
        with self._lock:
            ranks = list(self._ranks)
        asked = selectors.DefaultSelector()
        for rank in ranks:
            try:
                rank.connection.settimeout(1)
                rank.connection.sendall(b"dump\n")
                rank.connection.setblocking(False)
                rank.received = b""
                asked.register(rank.connection, selectors.EVENT_READ, rank)
            except OSError:
                self._drop(rank)  # gone: its process ended
                continue
        found: list[RankStacks] = []
        with asked:
            while asked.get_map() and (left := deadline - time.monotonic()) > 0:
                for key, _ in asked.select(left):
                    rank = key.data
                    answer = self._read(rank)
                    if answer is None:
                        continue
                    asked.unregister(rank.connection)
                    if not answer:  # its process ended, or it answered nonsense: ask it no more
                        self._drop(rank)
                    else:
                        found.append(
                            RankStacks(
                                rank.pid,
                                rank.rank,
                                rank.local_rank,
                                answer,
                                top_frames(answer, rank.main),
                                node=rank.host,
                            )
                        )
        return by_rank(found)

    def _drop(self, rank: _Rank) -> None:
        with self._lock:
            if rank in self._ranks:
                self._ranks.remove(rank)
        rank.connection.close()

    @staticmethod
    def _read(rank: _Rank) -> str | None:
        """The dump once its line is complete ("" for a closed or broken connection), else None."""
        try:
            chunk = rank.connection.recv(65536)
        except BlockingIOError:
            return None
        except OSError:
            return ""
        if not chunk:
            return ""
        rank.received += chunk
        if b"\n" not in rank.received:
            return None if len(rank.received) < _DUMP_LIMIT else ""
        try:
            text = json.loads(rank.received.split(b"\n", 1)[0]).get("text")
        except (ValueError, AttributeError, RecursionError):  # not JSON, not an object, nested thousands deep
            return ""
        return text if isinstance(text, str) else ""

    def _accepted(self, connection: socket.socket) -> None:
        """Keep a rank that says who it is (its first line: the token, its pid and rank)."""
        hello = self.first_line(connection, _HELLO_LIMIT)
        if hello is None or _number(hello.get("pid")) is None:
            connection.close()
            return
        with self._lock:
            if self._closed.is_set():
                connection.close()
                return
            self._ranks.append(_Rank(connection, hello))


def _number(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
