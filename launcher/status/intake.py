"""Where progress reaches the launcher besides the ranks' output lines.

- ``ProgressSocket``: the datagrams of ``launcher.progress.report`` (one per call, from any rank);
- ``JsonlTail``: a JSON-lines file that the program appends to;
- ``Relay``: a local stand-in for the Trainer status server. The ranks' ``KUBEFLOW_TRAINER_SERVER_URL``
  points at it, so the HuggingFace ``KubeflowCallback`` and the Kubeflow SDK's
  ``update_trainjob_status`` work unchanged, and the launcher stays the only sender for the job.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import threading
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from launcher.status.lines import Observation

SOCKET_ENV = "LAUNCHER_PROGRESS_SOCKET"
MAX_BODY = 64 * 1024  # the status server's own limit
_MAX_DRAIN_BODY = 4 * 1024 * 1024
_MAX_DATAGRAM = 256 * 1024
_MAX_DRAIN = 4096  # datagrams per receive(): the supervisor's loop has other work too
_MAX_METRICS = 256
_MAX_TEXT = 256
_MAX_READ = 1024 * 1024  # bytes of the JSON-lines file per read_new()
_MAX_LINE = 64 * 1024
_STEP_KEYS = ("step", "global_step", "iteration", "current_step")
_TOTAL_KEYS = ("total", "total_steps", "max_steps")
_NOT_METRICS = frozenset((*_STEP_KEYS, *_TOTAL_KEYS, "rank", "metrics", "time", "timestamp"))


class ProgressSocket:
    """The launcher's end of ``launcher.progress``: an AF_UNIX datagram socket, never blocking."""

    def __init__(self, path: str):
        self.path = path
        try:
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                os.unlink(path)  # a previous launcher's, in a reused directory
        except FileNotFoundError:
            pass
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            self._socket.bind(path)
            self._socket.setblocking(False)
            # room for bursts between two turns of the supervisor's loop
            self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        except OSError:
            self._socket.close()
            raise

    def fileno(self) -> int:
        return self._socket.fileno()

    def receive(self) -> list[Observation]:
        """What is queued now; a datagram that is not a progress report is ignored."""
        found = []
        for _ in range(_MAX_DRAIN):
            try:
                data = self._socket.recv(_MAX_DATAGRAM)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                break
            observation = _from_datagram(data)
            if observation is not None:
                found.append(observation)
        return found

    def close(self) -> None:
        self._socket.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)


def _from_datagram(data: bytes) -> Observation | None:
    try:
        message = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(message, dict):
        return None
    metrics = message.get("metrics")
    return _observation(message, metrics if isinstance(metrics, dict) else {}, "api")


class JsonlTail:
    """New complete lines of a JSON-lines file, each an object such as
    ``{"step": 10, "total": 1000, "loss": 0.5}`` (``rank``, and ``metrics`` as an object, are
    optional). Lines already in the file when the tail is made belong to an earlier run and are
    skipped; a file truncated or replaced is read again from its start."""

    def __init__(self, path: str):
        self.path = path
        self._identity: tuple[int, int] | None = None
        self._offset = 0
        self._partial = b""
        try:
            info = os.stat(path)
        except OSError:
            return
        self._identity, self._offset = (info.st_dev, info.st_ino), info.st_size

    def read_new(self) -> list[Observation]:
        try:
            with open(self.path, "rb") as file:
                info = os.fstat(file.fileno())
                identity = (info.st_dev, info.st_ino)
                if identity != self._identity or info.st_size < self._offset:
                    self._identity, self._offset, self._partial = identity, 0, b""
                if info.st_size == self._offset:
                    return []
                file.seek(self._offset)
                data = file.read(_MAX_READ)
        except OSError:
            return []  # not written yet (or not readable): nothing new
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        if len(self._partial) > _MAX_LINE:
            self._partial = b""  # no line is that long: skip to the next newline
        found = []
        for line in lines:
            observation = _from_line(line) if len(line) <= _MAX_LINE else None
            if observation is not None:
                found.append(observation)
        return found


def _from_line(line: bytes) -> Observation | None:
    line = line.strip()
    if not line:
        return None
    try:
        record = json.loads(line)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(record, dict):
        return None
    metrics = {name: value for name, value in record.items() if name not in _NOT_METRICS}
    nested = record.get("metrics")
    if isinstance(nested, dict):
        metrics.update(nested)
    return _observation(record, metrics, "file")


def _observation(record: dict, metrics: dict, source: str) -> Observation:
    step = _first_count(record, _STEP_KEYS)
    total = _first_count(record, _TOTAL_KEYS)
    rank = _count(record.get("rank"))
    pairs: list[tuple[str, str]] = []
    for name, value in metrics.items():
        if len(pairs) >= _MAX_METRICS:
            break
        text = _metric_text(value)
        if text is not None and isinstance(name, str) and name:
            pairs.append((name[:_MAX_TEXT], text))
    # even an empty report is a heartbeat: the rank is alive and past that point
    return Observation(step=step, total=total if total else None, metrics=tuple(pairs), rank=rank, source=source)


def _first_count(record: dict, keys: tuple[str, ...]) -> int | None:
    for key in keys:
        value = _count(record.get(key))
        if value is not None:
            return value
    return None


def _count(value) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    return None


def _metric_text(value) -> str | None:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return repr(value) if isinstance(value, float) else str(value)
    if isinstance(value, str) and value:
        return value[:_MAX_TEXT]
    return None


# --- the relay -----------------------------------------------------------------------------------

# Who posts, by User-Agent: the SDK posts with requests, HF's KubeflowCallback with urllib.
_CLIENTS = (("python-requests/", "kubeflow-sdk"), ("Python-urllib/", "hf-callback"))


class Relay:
    """Answers the ranks' status posts like the status server would, and keeps what they said."""

    def __init__(self, path: str):
        self.path = path
        self.clients: set[str] = set()
        self._lock = threading.Lock()
        self._taken: list[Observation] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}{path}"
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.2}, name="status-relay", daemon=True
        )
        self._thread.start()

    def take(self) -> list[Observation]:
        with self._lock:
            taken, self._taken = self._taken, []
        return taken

    def close(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=2.0)
        self._server.server_close()

    def _keep(self, client: str, observation: Observation | None) -> None:
        with self._lock:
            self.clients.add(client)
            if observation is not None:
                self._taken.append(observation)


def _handler(relay: Relay) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the SDK's session expects
        server_version = "trainer-launcher-relay"
        sys_version = ""
        timeout = 10  # a client that stops mid-request does not hold a thread for ever

        def do_POST(self) -> None:
            if self.path.split("?", 1)[0] != relay.path:
                self._discard_body()
                return self._status(404, "Not found", "NotFound")
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if length > MAX_BODY:
                # read what is sensible first: a connection closed on unread data is reset, and
                # the client would see that instead of the 413
                self.close_connection = True
                if length <= _MAX_DRAIN_BODY:
                    self.rfile.read(length)
                return self._status(413, "Payload too large", "RequestEntityTooLarge")
            body = self.rfile.read(length) if length > 0 else b""
            try:
                request = json.loads(body)
            except (ValueError, UnicodeDecodeError, RecursionError):
                request = None
            if not isinstance(request, dict):
                return self._status(422, "Invalid payload", "Invalid")
            status = _go_fields(request, _REQUEST_KEYS).get("trainerStatus")
            if status is None:
                relay._keep(_client(self.headers.get("User-Agent")), None)
                return self._json(200, request)
            problem = _invalid(status)
            if problem is not None:
                return self._status(422, problem, "Invalid")
            relay._keep(_client(self.headers.get("User-Agent")), _from_status(status))
            return self._json(200, request)

        def do_GET(self) -> None:
            self._status(404, "Not found", "NotFound")

        do_PUT = do_PATCH = do_DELETE = do_GET  # noqa: N815 - http.server dispatches on do_<METHOD>

        def _discard_body(self) -> None:
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = 0
            if 0 < length <= MAX_BODY:
                self.rfile.read(length)
            elif length:
                self.close_connection = True

        def _status(self, code: int, message: str, reason: str) -> None:
            # a Kubernetes Status, as the status server writes it
            self._json(code, {"metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code})

        def _json(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode() + b"\n"
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args) -> None:
            pass

    return Handler


def _client(user_agent: str | None) -> str:
    if not user_agent:
        return "unknown"
    for prefix, name in _CLIENTS:
        if user_agent.startswith(prefix):
            return name
    return user_agent[:64]


# The keys the status server decodes (trainer.UpdateTrainJobStatusRequest and its TrainJob types).
_REQUEST_KEYS = ("trainerStatus",)
_STATUS_KEYS = ("progressPercentage", "estimatedRemainingSeconds", "metrics", "lastUpdatedTime")
_METRIC_KEYS = ("name", "value")


def _go_fields(obj: dict, names: tuple[str, ...]) -> dict:
    """``obj``'s values for ``names`` as Go's encoding/json finds them, which the status server
    decodes with: a key matches a name without regard to case, the exact spelling first; other
    keys are ignored."""
    found = {}
    for name in names:
        if name in obj:
            found[name] = obj[name]
            continue
        folded = name.casefold()
        for key, value in obj.items():
            if isinstance(key, str) and key.casefold() == folded:
                found[name] = value
                break
    return found


def _canonical(status: dict) -> dict:
    """A trainerStatus with its keys and its metrics' keys spelled as the status server's types spell them."""
    status = _go_fields(status, _STATUS_KEYS)
    metrics = status.get("metrics")
    if isinstance(metrics, list):
        status["metrics"] = [_go_fields(m, _METRIC_KEYS) if isinstance(m, dict) else m for m in metrics]
    return status


def _invalid(status) -> str | None:
    """Why the status server would refuse this trainerStatus (its decoding, then the TrainJob's
    schema), or None."""
    if not isinstance(status, dict):
        return "Invalid payload"
    status = _canonical(status)
    for field in ("progressPercentage", "estimatedRemainingSeconds"):
        value = status.get(field)
        if value is not None and not _is_int32(value):
            return "Invalid payload"
    metrics = status.get("metrics")
    if metrics is not None and (
        not isinstance(metrics, list)
        or not all(
            isinstance(m, dict) and isinstance(m.get("name", ""), str) and isinstance(m.get("value", ""), str)
            for m in metrics
        )
    ):
        return "Invalid payload"
    updated = status.get("lastUpdatedTime")
    if updated is not None and (not isinstance(updated, str) or not _is_rfc3339(updated)):
        return "Invalid payload"
    percent = status.get("progressPercentage")
    if percent is not None and not 0 <= percent <= 100:
        return f"trainerStatus.progressPercentage: Invalid value: {percent}: must be between 0 and 100"
    eta = status.get("estimatedRemainingSeconds")
    if eta is not None and eta < 0:
        return f"trainerStatus.estimatedRemainingSeconds: Invalid value: {eta}: must be >= 0"
    if metrics is not None:
        if len(metrics) > 256:
            return f"trainerStatus.metrics: Too many: {len(metrics)}: must have at most 256 items"
        for i, metric in enumerate(metrics):
            for key in ("name", "value"):
                if not 1 <= len(metric.get(key, "")) <= 64:
                    return f"trainerStatus.metrics[{i}].{key}: Invalid value: must be 1 to 64 characters"
    if not updated:
        return "trainerStatus: Invalid value: lastUpdatedTime is required when trainerStatus is present"
    return None


def _is_int32(value) -> bool:
    # Go will not decode 50.0 or 5e1 into an int32 either: JSON's float syntax is refused
    return isinstance(value, int) and not isinstance(value, bool) and -(2**31) <= value < 2**31


def _is_rfc3339(text: str) -> bool:
    if len(text) < 20 or text[10] not in "Tt":
        return False
    try:
        parsed = datetime.fromisoformat(text.replace("z", "Z").replace("Z", "+00:00"))
    except ValueError:
        return False
    return parsed.tzinfo is not None


def _from_status(status: dict) -> Observation:
    status = _canonical(status)
    metrics = tuple((m["name"], m["value"]) for m in status.get("metrics") or ())
    values = dict(metrics)
    percent = status.get("progressPercentage")
    eta = status.get("estimatedRemainingSeconds")
    # HF's callback sends its step and max_steps as metrics: they are the job's progress too
    return Observation(
        step=_int_text(values.get("current_step")),
        total=_int_text(values.get("total_steps")),
        metrics=metrics,
        percent=None if percent is None else float(percent),
        eta=None if eta is None else float(eta),
        source="relay",
    )


def _int_text(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None
