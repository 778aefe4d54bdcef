"""The launcher's end of the rank failure reports (``launcher.mpi.rank`` is the ranks' end): a
TCP listener on an ephemeral port, reachable from the workers the way MPI's own wire-up is, that
keeps every report carrying its token, in the order they arrived."""

from __future__ import annotations

import json
import secrets
import socket
import threading
from dataclasses import dataclass

from launcher.mpi.rank import REPORT_ENV

_LINE_LIMIT = 64 * 1024


@dataclass(frozen=True)
class RankFailure:
    """One rank's report of its own failure."""

    rank: int
    host: str | None
    exit_code: int | None
    local_rank: int | None = None
    error: str | None = None  # the exception, in a line

    @classmethod
    def parse(cls, data) -> RankFailure | None:
        def number(value) -> int | None:
            return value if isinstance(value, int) and not isinstance(value, bool) else None

        def text(value) -> str | None:
            return value if isinstance(value, str) and value else None

        if not isinstance(data, dict) or number(data.get("rank")) is None:
            return None
        return cls(rank=data["rank"], host=text(data.get("host")), exit_code=number(data.get("exitCode")),
                   local_rank=number(data.get("localRank")), error=text(data.get("error")))


def facing_address(hosts: tuple[str, ...], port: int) -> tuple[int, str]:
    """(family, address) of this pod's interface towards the first of ``hosts`` that resolves;
    loopback when every rank runs here. No packet is sent."""
    for host in hosts:
        try:
            family, kind, proto, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
            with socket.socket(family, kind, proto) as probe:
                probe.connect(sockaddr)
                return family, probe.getsockname()[0]
        except OSError:
            continue
    return socket.AF_INET, "127.0.0.1"


class RankReports:
    """Collects failure reports while the job runs. ``env`` tells the ranks where to send them."""

    def __init__(self, family: int, address: str):
        self.token = secrets.token_hex(16)
        self._reports: list[RankFailure] = []
        self._lock = threading.Lock()
        self._server = socket.socket(family, socket.SOCK_STREAM)
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", 0))
        self._server.listen(64)
        self._server.settimeout(1)  # where shutdown() cannot wake accept(), close() waits this long
        self.env = {REPORT_ENV: f"{address}/{self._server.getsockname()[1]}/{self.token}"}
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="rank-reports", daemon=True)
        self._thread.start()

    @classmethod
    def towards(cls, hosts: tuple[str, ...], port: int) -> RankReports:
        return cls(*facing_address(hosts, port))

    def __enter__(self) -> RankReports:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._closed.set()
        try:
            self._server.shutdown(socket.SHUT_RDWR)  # wakes the accept() at once (Linux)
        except OSError:
            pass
        self._thread.join(timeout=2)
        self._server.close()

    @property
    def received(self) -> list[RankFailure]:
        """The reports so far, the first to arrive first."""
        with self._lock:
            return list(self._reports)

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                connection, _ = self._server.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            with connection:
                self._take(connection)

    def _take(self, connection: socket.socket) -> None:
        connection.settimeout(2)
        received = b""
        try:
            while b"\n" not in received and len(received) < _LINE_LIMIT:
                chunk = connection.recv(4096)
                if not chunk:
                    break
                received += chunk
            data = json.loads(received.split(b"\n", 1)[0])
        except (OSError, ValueError):
            return
        token = data.get("token") if isinstance(data, dict) else None
        if not isinstance(token, str) or not secrets.compare_digest(token.encode(), self.token.encode()):
            return
        report = RankFailure.parse(data)
        if report is None:
            return
        with self._lock:
            self._reports.append(report)
        try:
            connection.sendall(b"ok\n")
        except OSError:
            pass
