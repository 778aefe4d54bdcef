"""Wait for a DNS name to resolve and a TCP port to accept, with backoff and one deadline.

A pod's own name can stay unresolvable for seconds after its container starts, and the master's
port opens only when rank 0's agent is up: torchrun fails at once on both. We wait instead.
"""

from __future__ import annotations

import random
import socket
import time
from typing import Callable

from launcher.outcome import WaitTimeout

Sleep = Callable[[float], None]


def _backoff(attempt: int) -> float:
    # 0.1, 0.2, 0.4 ... capped at 2 s, with jitter so 512 pods do not knock in step.
    return min(2.0, 0.1 * 2**attempt) * random.uniform(0.5, 1.0)


def wait_until_resolves(name: str, deadline: float, sleep: Sleep = time.sleep, log=None) -> list[str]:
    """Addresses of ``name`` once it resolves; WaitTimeout naming it at ``deadline`` (monotonic)."""
    attempt = 0
    last_error = ""
    while True:
        try:
            infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
            return sorted({info[4][0] for info in infos})
        except (socket.gaierror, UnicodeError) as error:
            last_error = str(error)
        if attempt == 0 and log:
            log(f"waiting for {name} to resolve ({last_error})")
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"the name {name} never resolved ({last_error})")
        sleep(min(_backoff(attempt), max(0.0, deadline - time.monotonic())))
        attempt += 1


def wait_until_accepts(host: str, port: int, deadline: float, sleep: Sleep = time.sleep, log=None) -> None:
    """Return once ``host:port`` accepts a TCP connection; WaitTimeout naming it at ``deadline``."""
    attempt = 0
    last_error = ""
    while True:
        remaining = deadline - time.monotonic()
        try:
            with socket.create_connection((host, port), timeout=max(0.1, min(2.0, remaining))):
                return
        except OSError as error:
            last_error = error.strerror or str(error)
        if attempt == 0 and log:
            log(f"waiting for {host}:{port} to accept connections ({last_error})")
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"{host}:{port} never accepted a connection ({last_error})")
        sleep(min(_backoff(attempt), max(0.0, deadline - time.monotonic())))
        attempt += 1
