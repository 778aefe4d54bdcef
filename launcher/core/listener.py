"""A TCP listener for the job's own processes: an ephemeral port, and a per-job token that a
client's first line (JSON) must carry. Its address goes to the ranks in one variable,
``<address>/<port>/<token>`` (no spaces: hydra passes remote ranks their environment through a
shell command line). Subclasses decide what to do with a connection that proved itself."""

from __future__ import annotations

import json
import secrets
import socket
import threading

FIRST_LINE_TIMEOUT = 2.0


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
        self._thread = threading.Thread(target=self._serve, name=thread_name, daemon=True)
        self._thread.start()

    def __enter__(self):
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

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                connection, _ = self._server.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            self._accepted(connection)

    def _accepted(self, connection: socket.socket) -> None:
        """A new connection; its first line is read with :meth:`first_line`."""
        raise NotImplementedError

    def first_line(self, connection: socket.socket, limit: int) -> dict | None:
        """The client's first line as a JSON object, if it carries the token; else None."""
        connection.settimeout(FIRST_LINE_TIMEOUT)
        received = b""
        try:
            while b"\n" not in received and len(received) < limit:
                chunk = connection.recv(4096)
                if not chunk:
                    break
                received += chunk
            data = json.loads(received.split(b"\n", 1)[0])
        except (OSError, ValueError):
            return None
        token = data.get("token") if isinstance(data, dict) else None
        if not isinstance(token, str) or not secrets.compare_digest(token.encode(), self.token.encode()):
            return None
        return data
