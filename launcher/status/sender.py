"""Sends status updates to the Trainer status server from a daemon thread.

Training must never wait for, or fail because of, the status server: :meth:`Sender.offer` only
stores the latest body; the thread sends it when the throttle allows. A problem is logged once
(one line, never the token), then retried quietly with back-off until the server answers again.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import launcher
from launcher.core import log
from launcher.status.payload import encode
from launcher.status.settings import StatusEnv

REQUEST_TIMEOUT = 5.0
_USER_AGENT = f"trainer-launcher/{launcher.__version__}"
_REJECTED = (413, 422)  # the body itself is wrong: sending it again cannot help


class _Failure(Exception):
    """One failed send: ``what`` for the log line, ``kind`` to log each kind of problem once."""

    def __init__(self, what: str, kind: str, status: int | None = None):
        super().__init__(what)
        self.what, self.kind, self.status = what, kind, status


class Sender:
    def __init__(
        self,
        env: StatusEnv,
        interval: float = 5.0,
        on_problem: Callable[[str], None] = log.warning,
        *,
        on_recovered: Callable[[str], None] = log.info,
        backoff: tuple[float, float] = (5.0, 60.0),
        request_timeout: float = REQUEST_TIMEOUT,
    ):
        self.url = env.url or ""
        self._parts = urlsplit(self.url)
        self._target = self._parts.path + (f"?{self._parts.query}" if self._parts.query else "")
        self._ca_cert, self._token_path = env.ca_cert, env.token
        self._interval, self._backoff = interval, backoff
        self._request_timeout = min(request_timeout, REQUEST_TIMEOUT)
        self._on_problem, self._on_recovered = on_problem, on_recovered
        self._lock = threading.Lock()  # guards _pending only; held for an assignment
        self._send_lock = threading.Lock()  # one request at a time, so the final one is the last
        self._wake = threading.Event()
        self._pending: dict | None = None
        self._closing = False
        self._thread: threading.Thread | None = None
        self._next_at = 0.0
        self._delay = backoff[0]
        self._logged: set[str] = set()  # kinds of problem logged since the last success
        self._token = ""  # the last token read, only to keep it out of log lines
        self._context: ssl.SSLContext | None = None
        self._context_key: tuple | None = None
        self.sent = 0
        self.failed = 0

    # --- the caller's side: never blocks, never raises -----------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="status-sender", daemon=True)
            self._thread.start()

    def offer(self, body: dict) -> None:
        if self._closing:
            return
        with self._lock:
            idle, self._pending = self._pending is None, body
        if idle:  # the thread waits only for the first body of an interval: later ones just replace it
            self._wake.set()

    def close(self, final: dict | None, timeout: float = 5.0) -> bool:
        """Stop the thread; send ``final`` now (one try, one retry), within ``timeout`` seconds."""
        self._closing = True
        self._wake.set()
        if final is None:
            return False
        result: list[bool] = []
        sender = threading.Thread(
            target=lambda: result.append(self._send_final(final, time.monotonic() + timeout)),
            name="status-final",
            daemon=True,
        )
        sender.start()
        sender.join(timeout)
        return bool(result and result[0])

    # --- the thread ------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._closing:
            self._wake.clear()
            if self._pending is None:
                self._wake.wait()
                continue
            delay = self._next_at - time.monotonic()
            if delay > 0:
                self._wake.wait(delay)  # close() cuts it short; offers do not
                continue
            with self._lock:
                body, self._pending = self._pending, None
            if body is None:
                continue
            with self._send_lock:
                if self._closing:
                    return
                failure = self._attempt(body, self._request_timeout)
            if failure is None:
                self._next_at = time.monotonic() + self._interval
                self._delay = self._backoff[0]
                continue
            self._next_at = time.monotonic() + max(self._delay, self._interval)
            self._delay = min(self._delay * 2, self._backoff[1])
            if failure.status not in _REJECTED:
                with self._lock:  # retry the latest body, unless a newer one came in meanwhile
                    if self._pending is None:
                        self._pending = body

    def _send_final(self, body: dict, deadline: float) -> bool:
        # Wait (a little) for a request in flight, so an older status cannot land after the final one.
        locked = self._send_lock.acquire(timeout=max(0.0, (deadline - time.monotonic()) / 2))
        try:
            for _ in range(2):
                left = deadline - time.monotonic()
                if left <= 0.05:
                    return False
                failure = self._attempt(body, min(self._request_timeout, left))
                if failure is None:
                    return True
                if failure.status in _REJECTED:
                    return False
            return False
        finally:
            if locked:
                self._send_lock.release()

    # --- one request -------------------------------------------------------------------------------

    def _attempt(self, body: dict, timeout: float) -> _Failure | None:
        """Send once; count and log the outcome. Never raises."""
        try:
            self._post(body, timeout)
        except _Failure as failure:
            self.failed += 1
            if failure.kind not in self._logged:
                self._logged.add(failure.kind)
                self._say(
                    self._on_problem, f"status server {self.url}: {failure.what}; progress will be retried quietly"
                )
            return failure
        except Exception as error:  # noqa: BLE001 - reporting must never take the launcher down
            self.failed += 1
            if "internal" not in self._logged:
                self._logged.add("internal")
                self._say(
                    self._on_problem,
                    f"status server {self.url}: {type(error).__name__}: {error}; progress will be retried quietly",
                )
            return _Failure(str(error), "internal")
        self.sent += 1
        if self._logged:
            rejected_only = all(kind.startswith("rejected") for kind in self._logged)
            self._logged.clear()
            self._say(
                self._on_recovered,
                f"status server {self.url} " + ("accepts the status again" if rejected_only else "reachable again"),
            )
        return None

    def _say(self, write: Callable[[str], None], line: str) -> None:
        if self._token:
            line = line.replace(self._token, "***")
        with contextlib.suppress(Exception):  # a broken log sink must not stop reporting
            write(line)

    def _read_token(self) -> str:
        try:
            with open(self._token_path or "", encoding="utf-8") as file:
                token = file.read().strip()
        except (OSError, UnicodeDecodeError) as error:
            # A UnicodeDecodeError has no strerror: reading it there failed as the sender's own error.
            reason = (error.strerror if isinstance(error, OSError) else None) or error
            raise _Failure(f"cannot read the token file {self._token_path} ({reason})", "token") from None
        if not token or any(c.isspace() for c in token):
            raise _Failure(f"the token file {self._token_path} is empty or not one token", "token")
        self._token = token
        return token

    def _tls(self) -> ssl.SSLContext:
        """The TLS context, rebuilt when the CA file changes (its ConfigMap can be updated in place)."""
        key = None
        if self._ca_cert:
            try:
                stat = os.stat(self._ca_cert)
                key = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
            except OSError as error:
                raise _Failure(f"cannot read the CA certificate {self._ca_cert} ({error.strerror})", "ca") from None
        if self._context is None or key != self._context_key:
            try:
                self._context = ssl.create_default_context(cafile=self._ca_cert)
            except (OSError, ssl.SSLError) as error:
                raise _Failure(f"cannot load the CA certificate {self._ca_cert} ({error})", "ca") from None
            self._context_key = key
        return self._context

    def _post(self, body: dict, timeout: float) -> None:
        data = encode(body)
        headers = {
            "Authorization": f"Bearer {self._read_token()}",
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": _USER_AGENT,
        }
        host, port = self._parts.hostname or "", self._parts.port
        if self._parts.scheme == "https":
            connection: http.client.HTTPConnection = http.client.HTTPSConnection(
                host, port, timeout=timeout, context=self._tls()
            )
        else:
            connection = http.client.HTTPConnection(host, port, timeout=timeout)
        # One deadline for the whole exchange: http.client's timeout bounds each read, and a server
        # that sends a byte at a time would hold the request (and every later update) forever.
        expired = threading.Event()
        deadline = threading.Timer(timeout, _abort, (connection, expired))
        deadline.daemon = True
        deadline.start()
        try:
            connection.request("POST", self._target, body=data, headers=headers)
            response = connection.getresponse()
            reply = response.read(MAX_REPLY)
            status = response.status
        except ssl.SSLCertVerificationError as error:
            raise _Failure(f"TLS verification failed ({error.verify_message})", "tls") from None
        except (OSError, ValueError, http.client.HTTPException) as error:
            raise _Failure("no answer in time" if expired.is_set() else _network_problem(error), "network") from None
        finally:
            deadline.cancel()
            connection.close()
        if status == 200:
            return
        message = _status_message(reply)
        what = f"HTTP {status}" + (f" ({message})" if message else "")
        if status in _REJECTED:
            raise _Failure(what + "; this update was dropped", f"rejected-{status}", status)
        if status == 403:
            what += f"; the token in {self._token_path} was refused"
        raise _Failure(what, f"http-{status}", status)


MAX_REPLY = 64 * 1024


def _abort(connection: http.client.HTTPConnection, expired: threading.Event) -> None:
    """The request's deadline passed: wake the read blocked on its socket."""
    expired.set()
    sock = connection.sock
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def _status_message(reply: bytes) -> str:
    """The reason and message of a Kubernetes ``Status`` reply, on one line."""
    try:
        status = json.loads(reply)
        text = ": ".join(str(status[k]) for k in ("reason", "message") if status.get(k))
    except (ValueError, TypeError, AttributeError):
        text = reply.decode("utf-8", "replace")
    return " ".join(text.split())[:500]


def _network_problem(error: BaseException) -> str:
    if isinstance(error, TimeoutError) or "timed out" in str(error):
        return "no answer in time"
    if isinstance(error, ConnectionRefusedError):
        return "connection refused"
    text = getattr(error, "strerror", None) or str(error) or type(error).__name__
    return " ".join(str(text).split())
