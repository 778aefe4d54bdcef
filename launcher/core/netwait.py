"""Wait for a DNS name to resolve and a TCP port to accept, with backoff and one deadline.

A pod's own name can stay unresolvable for seconds after its container starts, and the master's
port opens only when rank 0's agent is up: torchrun fails at once on both. We wait instead.
"""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Callable
from typing import TypeVar

from launcher.core.outcome import WaitTimeout

Sleep = Callable[[float], None]
T = TypeVar("T")


def _backoff(attempt: int) -> float:
    # 0.1, 0.2, 0.4 ... capped at 2 s, with jitter so 512 pods do not knock in step. The exponent
    # is capped too: a caller that knocks more often than this waits (every 0.2 s on a tracker, say)
    # reaches thousands of tries, and 2.0**1024 overflows.
    return min(2.0, 0.1 * 2.0 ** min(attempt, 5)) * random.uniform(0.5, 1.0)


def _until(attempt: Callable[[], T], waiting: str, failed: str, deadline: float, sleep: Sleep, log) -> T:
    """Call ``attempt`` until it returns; log once while waiting; WaitTimeout at ``deadline``."""
    tries = 0
    while True:
        try:
            return attempt()
        except (OSError, UnicodeError) as error:
            reason = getattr(error, "strerror", None) or str(error)
        if tries == 0 and log:
            log(f"waiting for {waiting} ({reason})")
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"{failed} ({reason})")
        sleep(min(_backoff(tries), max(0.0, deadline - time.monotonic())))
        tries += 1


def wait_until_resolves(name: str, deadline: float, sleep: Sleep = time.sleep, log=None) -> list[str]:
    """Addresses of ``name`` once it resolves; WaitTimeout naming it at ``deadline`` (monotonic)."""

    def resolve() -> list[str]:
        return sorted({str(info[4][0]) for info in socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)})

    return _until(resolve, f"{name} to resolve", f"the name {name} never resolved", deadline, sleep, log)


def wait_until_accepts(host: str, port: int, deadline: float, sleep: Sleep = time.sleep, log=None) -> None:
    """Return once ``host:port`` accepts a TCP connection; WaitTimeout naming it at ``deadline``."""

    def connect() -> None:
        timeout = max(0.1, min(2.0, deadline - time.monotonic()))
        socket.create_connection((host, port), timeout=timeout).close()

    _until(
        connect,
        f"{host}:{port} to accept connections",
        f"{host}:{port} never accepted a connection",
        deadline,
        sleep,
        log,
    )


def knock(host: str, port: int, timeout: float) -> None:
    """Connect and, if the server speaks first (sshd's banner), answer with an identification line
    before closing, so sshd does not log every probe as a failed key exchange."""
    with socket.create_connection((host, port), timeout=timeout) as connection:
        connection.settimeout(min(timeout, 0.5))
        try:
            if connection.recv(256).startswith(b"SSH-"):
                connection.sendall(b"SSH-2.0-trainer-launcher-probe\r\n")
        except OSError:
            pass  # a server that waits for us to speak first is up all the same


def wait_until_hosts_accept(
    hosts: tuple[str, ...], port: int, deadline: float, sleep: Sleep = time.sleep, log=None
) -> None:
    """Every host resolves and accepts TCP on ``port``; WaitTimeout naming those that never did."""
    pending = list(hosts)
    tries = 0
    reasons: dict[str, str] = {}
    while pending:
        for host in list(pending):
            try:
                knock(host, port, max(0.1, min(2.0, deadline - time.monotonic())))
                pending.remove(host)
            except (OSError, UnicodeError) as error:
                reasons[host] = getattr(error, "strerror", None) or str(error)
        if not pending:
            return
        if tries == 0 and log:
            log(
                f"waiting for {len(pending)} of {len(hosts)} hosts to accept ssh on port {port}: "
                + ", ".join(f"{h} ({reasons[h]})" for h in pending[:5])
            )
        if time.monotonic() >= deadline:
            raise WaitTimeout(
                f"{len(pending)} of {len(hosts)} hosts never accepted ssh on port {port}: "
                + ", ".join(f"{h} ({reasons[h]})" for h in pending[:20])
            )
        sleep(min(_backoff(tries), max(0.0, deadline - time.monotonic())))
        tries += 1
