"""The pods of one XGBoost job telling each other that it failed: a stop board, served by pod 0.

xgboost's collective has no word for "a worker died": its peers usually see the broken ring at
once and raise, but not always. With three or more workers, a worker whose peer crashed can sit
in a collective until ``dmlc_timeout`` (30 minutes by default) - seen here with a worker that
exited through ``os._exit`` mid-round - and every pod that does notice exits with its own idea of
the cause. So pod 0's launcher serves a board on ``DMLC_TRACKER_PORT + 1`` and every other pod's
launcher keeps one connection to it, once the tracker is up:

- a launcher whose worker (or tracker) failed on its own posts a stop record, its pod's outcome;
  the first record wins;
- the board sends that record to every pod, pod 0 included; each stops its workers and exits with
  the record's exit code, naming the same worker;
- when the job succeeds, pod 0 (the last to finish: its tracker waits for every worker) says
  ``done`` before it leaves; a connection that breaks without ``done`` or a record means pod 0 is
  gone, and a pod whose workers still run stops them (138, PeerLost);
- after a failure, pod 0 keeps the board up until every pod has hung up, or ``LINGER`` seconds.

Newline-delimited JSON over TCP. Every socket is non-blocking and served from the supervisor's
select loop (``Supervisor.watch``); nothing here blocks but a client's connect and its one post.
A board that cannot listen or be reached costs the job this propagation only, and says so once.
"""

from __future__ import annotations

import json
import socket
from typing import Callable

PORT_OFFSET = 1  # the board listens on the tracker's port + 1
LINGER = 5.0  # seconds pod 0 keeps the board up after a failure, for the others to read the record
CONNECT_TIMEOUT = 2.0
LINE_LIMIT = 64 * 1024

Watch = Callable[[int, Callable[[], None]], None]
Unwatch = Callable[[int], None]


def _lines(buffer: bytearray, data: bytes) -> list[dict]:
    """Append ``data``; pop and parse every complete line (a malformed one is dropped)."""
    buffer.extend(data)
    messages = []
    while (end := buffer.find(b"\n")) != -1:
        line = bytes(buffer[:end])
        del buffer[:end + 1]
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if isinstance(message, dict):
            messages.append(message)
    if len(buffer) > LINE_LIMIT:
        buffer.clear()
    return messages


def _send(connection: socket.socket, message: dict) -> bool:
    try:
        connection.setblocking(True)
        connection.settimeout(CONNECT_TIMEOUT)
        connection.sendall(json.dumps(message).encode() + b"\n")
        connection.setblocking(False)
        return True
    except OSError:
        return False


class Board:
    """Pod 0's side: the listening socket and every other pod's connection."""

    def __init__(self, port: int, ipv6: bool, watch: Watch, unwatch: Unwatch, on_record: Callable[[dict], None]):
        self.record: dict | None = None
        self.done = False
        self._watch, self._unwatch, self._on_record = watch, unwatch, on_record
        self._clients: dict[int, tuple[socket.socket, bytearray]] = {}
        family = socket.AF_INET6 if ipv6 else socket.AF_INET
        self._server = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._server.bind(("::" if ipv6 else "0.0.0.0", port))
            self._server.listen(256)
        except OSError:
            self._server.close()
            raise
        self._server.setblocking(False)
        watch(self._server.fileno(), self._accept)

    @property
    def clients(self) -> int:
        return len(self._clients)

    def post(self, record: dict) -> None:
        """Our own pod's record: every other pod gets it (unless one was posted first)."""
        if self.record is None:
            self.record = record
            self._broadcast({"stop": record})

    def finish(self) -> None:
        """The job succeeded here: tell every pod the board closes on purpose."""
        self.done = True
        self._broadcast({"done": True})

    def close(self) -> None:
        for fd in list(self._clients):
            self._drop(fd)
        self._unwatch(self._server.fileno())
        self._server.close()

    def _accept(self) -> None:
        try:
            connection, _ = self._server.accept()
        except OSError:
            return
        connection.setblocking(False)
        fd = connection.fileno()
        self._clients[fd] = (connection, bytearray())
        self._watch(fd, lambda: self._read(fd))
        if self.record is not None:
            _send(connection, {"stop": self.record})
        elif self.done:
            _send(connection, {"done": True})

    def _read(self, fd: int) -> None:
        connection, buffer = self._clients[fd]
        try:
            data = connection.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop(fd)
            return
        for message in _lines(buffer, data):
            if isinstance(message.get("stop"), dict) and self.record is None:
                self.record = message["stop"]
                self._broadcast({"stop": self.record})
                self._on_record(self.record)

    def _broadcast(self, message: dict) -> None:
        for fd, (connection, _) in list(self._clients.items()):
            if not _send(connection, message):
                self._drop(fd)

    def _drop(self, fd: int) -> None:
        connection, _ = self._clients.pop(fd)
        self._unwatch(fd)
        connection.close()


class BoardClient:
    """Every other pod's side: one connection to pod 0's board."""

    def __init__(self, host: str, port: int, watch: Watch, unwatch: Unwatch,
                 on_record: Callable[[dict], None], on_lost: Callable[[], None]):
        self.record: dict | None = None
        self.done = False
        self._unwatch, self._on_record, self._on_lost = unwatch, on_record, on_lost
        self._buffer = bytearray()
        self._connection = socket.create_connection((host.strip("[]"), port), timeout=CONNECT_TIMEOUT)
        self._connection.setblocking(False)
        self._fd = self._connection.fileno()
        watch(self._fd, self._read)

    def post(self, record: dict) -> None:
        if self._fd != -1:
            _send(self._connection, {"stop": record})

    def close(self) -> None:
        if self._fd != -1:
            self._unwatch(self._fd)
            self._fd = -1
            self._connection.close()

    def _read(self) -> None:
        try:
            data = self._connection.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.close()
            if not self.done and self.record is None:
                self._on_lost()
            return
        for message in _lines(self._buffer, data):
            if message.get("done"):
                self.done = True
            elif isinstance(message.get("stop"), dict) and self.record is None:
                self.record = message["stop"]
                self._on_record(self.record)
