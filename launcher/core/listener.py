"""A TCP listener for the job's own processes: an ephemeral port, and a per-job token that a
client's first line (JSON) must carry. Its address goes to the ranks in one variable,
``<address>/<port>/<token>`` (no spaces: hydra passes remote ranks their environment through a
shell command line). Subclasses decide what to do with a connection that proved itself.

The pod network is shared: anyone in the cluster can reach the port. So no bytes from anyone end
the listener (every connection is handled under a catch-all, its first line parsed under one),
and no one peer holds it: each connection is served by a thread of its own, with one deadline for
its whole first line (not one per recv, which a peer sending a byte at a time would keep alive),
and at most MAX_PENDING first lines are awaited at once (beyond that a new connection is closed at
once, so a flood cannot exhaust threads; a rank retries nothing, but the flood ends with it)."""

from __future__ import annotations

import contextlib
import json
import secrets
import socket
import threading
import time

FIRST_LINE_TIMEOUT = 2.0  # seconds for a client's whole first line
MAX_PENDING = 64  # connections whose first line is awaited at once


class TokenListener:
    def __init__(self, family: int, address: str, env_name: str, thread_name: str):
        self.token = secrets.token_hex(16)
        self._server = socket.socket(family, socket.SOCK_STREAM)
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", 0))
        self._server.listen(128)
        self._server.settimeout(1)  # where shutdown() cannot wake accept(), close() waits this long
        self.env = {env_name: f"{address}/{self._server.getsockname()[1]}/{self.token}"}
        self._closed = threading.Event()
        self._pending = threading.BoundedSemaphore(MAX_PENDING)
        self._thread = threading.Thread(target=self._serve, name=thread_name, daemon=True)
        self._thread.start()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)  # wakes the accept() at once (Linux)
        self._thread.join(timeout=2)
        self._server.close()

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                connection, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if not self._pending.acquire(blocking=False):
                connection.close()  # a flood: serve the connections already here first
                continue
            try:
                threading.Thread(
                    target=self._handle, args=(connection,), daemon=True, name=f"{self._thread.name}-peer"
                ).start()
            except RuntimeError:  # no thread to be had
                self._pending.release()
                connection.close()

    def _handle(self, connection: socket.socket) -> None:
        """One connection, start to end; whatever its bytes do, the listener goes on."""
        try:
            self._accepted(connection)
        except Exception:  # noqa: BLE001 - a peer's bytes never end the listener
            connection.close()
        finally:
            self._pending.release()

    def _accepted(self, connection: socket.socket) -> None:
        """A new connection; its first line is read with :meth:`first_line`."""
        raise NotImplementedError

    def first_line(self, connection: socket.socket, limit: int) -> dict | None:
        """The client's first line as a JSON object, if it carries the token and comes within
        FIRST_LINE_TIMEOUT; else None."""
        deadline = time.monotonic() + FIRST_LINE_TIMEOUT
        received = b""
        try:
            while b"\n" not in received and len(received) < limit:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                connection.settimeout(left)
                chunk = connection.recv(4096)
                if not chunk:
                    break
                received += chunk
            data = json.loads(received.split(b"\n", 1)[0])
        except (OSError, ValueError, RecursionError):  # RecursionError: a line nested thousands deep
            return None
        token = data.get("token") if isinstance(data, dict) else None
        if not isinstance(token, str) or not secrets.compare_digest(token.encode(), self.token.encode()):
            return None
        return data
