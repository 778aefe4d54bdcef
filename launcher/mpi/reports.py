"""The launcher's end of the rank reports (``launcher.mpi.rank`` is the ranks' end): a TCP
listener on an ephemeral port, reachable from the workers the way MPI's own wire-up is, that keeps
every report carrying its token, in the order they arrived. A report is the launcher's one report
(launcher/runner/report.py), read with :func:`rank_report`.

This is MPI's transport for the stop record: the first report of the job is its stop record (its
root cause), and mpirun's abort carries the stop to the other ranks."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

from launcher.core.listener import TokenListener
from launcher.mpi.rank import REPORT_ENV
from launcher.runner.report import Report

_LINE_LIMIT = 64 * 1024


def rank_report(data: object) -> Report | None:
    """The report in a rank's line (decoded JSON), or None where it is none or names no rank: every
    rank knows its own (launcher.mpi.rank), and the job's root cause is a rank."""
    report = Report.parse(data)
    return report if report is not None and report.rank is not None else None


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
    """Collects the ranks' reports while the job runs. ``env`` tells the ranks where to send them."""

    def __init__(self, family: int, address: str):
        self._reports: list[Report] = []
        self._lock = threading.Lock()
        self.first_at: float | None = None  # time.monotonic() when the first report came
        super().__init__(family, address, REPORT_ENV, "rank-reports")

    @property
    def received(self) -> list[Report]:
        """The reports so far, the first to arrive first."""
        with self._lock:
            return list(self._reports)

    def _accepted(self, connection: socket.socket) -> None:
        with connection:
            report = rank_report(self.first_line(connection, _LINE_LIMIT))
            if report is None:
                return
            with self._lock:
                self._reports.append(report)
                if self.first_at is None:
                    self.first_at = time.monotonic()
            with contextlib.suppress(OSError):
                connection.sendall(b"ok\n")
