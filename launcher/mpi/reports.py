"""The launcher's end of the rank failure reports (``launcher.mpi.rank`` is the ranks' end): a
TCP listener on an ephemeral port, reachable from the workers the way MPI's own wire-up is, that
keeps every report carrying its token, in the order they arrived."""

from __future__ import annotations

import contextlib
import socket
import threading
from dataclasses import dataclass

from launcher.core.listener import TokenListener
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
        return cls(
            rank=data["rank"],
            host=text(data.get("host")),
            exit_code=number(data.get("exitCode")),
            local_rank=number(data.get("localRank")),
            error=text(data.get("error")),
        )


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


class RankReports(TokenListener):
    """Collects failure reports while the job runs. ``env`` tells the ranks where to send them."""

    def __init__(self, family: int, address: str):
        self._reports: list[RankFailure] = []
        self._lock = threading.Lock()
        super().__init__(family, address, REPORT_ENV, "rank-reports")

    @property
    def received(self) -> list[RankFailure]:
        """The reports so far, the first to arrive first."""
        with self._lock:
            return list(self._reports)

    def _accepted(self, connection: socket.socket) -> None:
        with connection:
            report = RankFailure.parse(self.first_line(connection, _LINE_LIMIT))
            if report is None:
                return
            with self._lock:
                self._reports.append(report)
            with contextlib.suppress(OSError):
                connection.sendall(b"ok\n")
