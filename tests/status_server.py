"""A stand-in for Kubeflow Trainer's status server (pkg/statusserver, v2.3.0), run as its own process.

    python tests/status_server.py --cert server.crt --key server.key --token-file DIR/token \\
        --record requests.jsonl --ready ready.json [--port 0] [--job NAMESPACE/NAME] [--control control.json]

It serves ``POST /apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs/{name}/status``
over HTTPS the way upstream does, checking in upstream's order:

1. a ``Content-Length`` over 64 KiB: 413 (before routing, as upstream's middleware);
2. any other method or path: 404;
3. the bearer token must equal the token file's CURRENT content (read per request, so a test can
   rotate it), and with ``--job`` the path must name that job (upstream's token audience): else 403;
4. the JSON must decode into ``UpdateTrainJobStatusRequest`` as Go would (unknown fields ignored,
   keys matched case-insensitively, int32 numbers, RFC 3339 times): else 422 "Invalid payload";
5. no ``trainerStatus``: 200 ``{}``; otherwise the CRD's rules (lastUpdatedTime required,
   progressPercentage 0..100, estimatedRemainingSeconds >= 0, at most 256 metrics, name and value
   1..64 characters): else 422 with the API server's kind of message;
6. 200 with the payload re-encoded as Go would.

Every error is a Kubernetes ``Status`` (kind, apiVersion, status Failure, message, reason, code).

Records: one JSON object per request appended to ``--record`` and flushed per line: ``event``
("request"; "delayed" when a request arrives while a delay is set, before waiting), ``time``
(epoch seconds), ``method``, ``path``, ``namespace``, ``name``, ``code``, ``reason``, ``message``,
``authorized``, ``token_sha256`` (first 12 hex digits of the presented token, never the token),
``user_agent``, ``size`` (body bytes), ``forced`` and ``body`` (the decoded JSON, or null).

Control: ``--control FILE`` is read at every request; write it atomically (write + rename). It is a
JSON object ``{"seq": N, "fail": CODE, "count": K, "message": TEXT, "delay": SECONDS}``:
a new ``seq`` arms ``fail`` for the next K requests (CODE 0 drops the connection without an
answer); ``delay`` (seconds, 0 to clear) holds every answer that long while it is set.

Readiness: the ``--ready`` file is written atomically with ``{"port": P, "pid": PID}`` once the
socket listens, and ``listening on P`` is printed on stdout.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import ssl
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAX_BODY = 1 << 16
MAX_METRICS = 256
MAX_LEN = 64
INT32 = (-(2**31), 2**31 - 1)
ROUTE = re.compile(r"^/apis/trainer\.kubeflow\.org/v1alpha1/namespaces/([^/]+)/trainjobs/([^/]+)/status$")
RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")
REASONS = {400: "BadRequest", 403: "Forbidden", 404: "NotFound", 409: "Conflict", 413: "RequestEntityTooLarge",
           422: "Invalid", 429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable"}


class Reply(Exception):
    def __init__(self, code: int, message: str, reason: str | None = None):
        super().__init__(message)
        self.code, self.message, self.reason = code, message, reason or REASONS.get(code, "Unknown")


# --- decoding as Go's encoding/json into trainer.UpdateTrainJobStatusRequest ---------------------


def _field(obj: dict, name: str):
    """Go matches keys case-insensitively, the exact spelling winning; unknown keys are ignored."""
    if name in obj:
        return obj[name]
    for key, value in obj.items():
        if key.lower() == name.lower():
            return value
    return None


def _int32(value, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not INT32[0] <= value <= INT32[1]:
        raise Reply(422, "Invalid payload")  # Go: cannot unmarshal ... into int32
    return value


def _string(value) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise Reply(422, "Invalid payload")
    return value


def decode(raw: bytes) -> dict | None:
    """The request as Go sees it: None (no trainerStatus) or the trainer status with Go's zero values."""
    try:
        request = json.loads(raw.decode("utf-8"), parse_float=_go_float)
    except (ValueError, UnicodeDecodeError):
        raise Reply(422, "Invalid payload") from None
    if request is None:
        return None
    if not isinstance(request, dict):
        raise Reply(422, "Invalid payload")
    status = _field(request, "trainerStatus")
    if status is None:
        return None
    if not isinstance(status, dict):
        raise Reply(422, "Invalid payload")
    metrics = _field(status, "metrics")
    if metrics is not None and not isinstance(metrics, list):
        raise Reply(422, "Invalid payload")
    decoded_metrics = []
    for item in metrics or []:
        if item is None:
            item = {}
        if not isinstance(item, dict):
            raise Reply(422, "Invalid payload")
        decoded_metrics.append({"name": _string(_field(item, "name")), "value": _string(_field(item, "value"))})
    updated = _field(status, "lastUpdatedTime")
    if updated is not None and (not isinstance(updated, str) or not RFC3339.match(updated)):
        raise Reply(422, "Invalid payload")
    return {
        "progressPercentage": _int32(_field(status, "progressPercentage"), "progressPercentage"),
        "estimatedRemainingSeconds": _int32(_field(status, "estimatedRemainingSeconds"), "estimatedRemainingSeconds"),
        "metrics": decoded_metrics,
        "lastUpdatedTime": updated,
    }


class _GoFloat(float):
    """A JSON number written with a fraction or exponent: Go refuses it for an int32 field."""


def _go_float(text: str) -> _GoFloat:
    return _GoFloat(text)


# --- the CRD's validation, as the API server reports it ---------------------------------------------


def validate(name: str, status: dict) -> list[str]:
    errors = []
    base = "status.trainerStatus"
    if status["lastUpdatedTime"] is None:
        errors.append(f'{base}: Invalid value: "object": lastUpdatedTime is required when trainerStatus is present')
    percent = status["progressPercentage"]
    if percent is not None and percent > 100:
        errors.append(f"{base}.progressPercentage: Invalid value: {percent}: {base}.progressPercentage "
                      "in body should be less than or equal to 100")
    if percent is not None and percent < 0:
        errors.append(f"{base}.progressPercentage: Invalid value: {percent}: {base}.progressPercentage "
                      "in body should be greater than or equal to 0")
    eta = status["estimatedRemainingSeconds"]
    if eta is not None and eta < 0:
        errors.append(f"{base}.estimatedRemainingSeconds: Invalid value: {eta}: {base}.estimatedRemainingSeconds "
                      "in body should be greater than or equal to 0")
    metrics = status["metrics"]
    if len(metrics) > MAX_METRICS:
        errors.append(f"{base}.metrics: Too many: {len(metrics)}: must have at most {MAX_METRICS} items")
    for index, metric in enumerate(metrics):
        for key in ("name", "value"):
            where = f"{base}.metrics[{index}].{key}"
            length = len(metric[key])  # Kubernetes counts characters (runes), as len() does
            if length == 0:
                errors.append(f"{where}: Required value")
            elif length > MAX_LEN:
                errors.append(f"{where}: Too long: may not be more than {MAX_LEN} characters")
    if not errors:
        return []
    joined = errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"
    return [f'TrainJob.trainer.kubeflow.org "{name}" is invalid: {joined}']


def echo(status: dict) -> dict:
    """The accepted request re-encoded as Go would (omitempty; metav1.Time in UTC, to the second)."""
    out: dict = {}
    for key in ("progressPercentage", "estimatedRemainingSeconds"):
        if status[key] is not None:
            out[key] = status[key]
    if status["metrics"]:
        out["metrics"] = status["metrics"]
    out["lastUpdatedTime"] = _utc(status["lastUpdatedTime"])
    return {"trainerStatus": out}


def _utc(text: str) -> str:
    import datetime
    value = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    return value.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- the server --------------------------------------------------------------------------------------


class Control:
    """The --control file: forced answers for the next requests, and a delay."""

    def __init__(self, path: str | None):
        self.path, self.seq, self.left, self.code, self.message, self.delay = path, None, 0, 0, None, 0.0
        self.lock = threading.Lock()

    def next(self) -> tuple[int | None, str | None, float]:
        with self.lock:
            if self.path:
                try:
                    with open(self.path) as file:
                        spec = json.load(file)
                except (OSError, ValueError):
                    spec = {}
                self.delay = float(spec.get("delay") or 0)
                if "fail" in spec and spec.get("seq") != self.seq:
                    self.seq, self.code = spec.get("seq"), int(spec["fail"])
                    self.left, self.message = int(spec.get("count", 1)), spec.get("message")
            if self.left > 0:
                self.left -= 1
                return self.code, self.message, self.delay
            return None, None, self.delay


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, options):
        super().__init__(("127.0.0.1", options.port), Handler)
        self.options = options
        self.control = Control(options.control)
        self.record_lock = threading.Lock()
        self.record_file = open(options.record, "a", encoding="utf-8")

    def record(self, entry: dict) -> None:
        with self.record_lock:
            self.record_file.write(json.dumps(entry) + "\n")
            self.record_file.flush()

    def handle_error(self, request, client_address):  # clients hanging up mid-request are expected
        pass


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 10  # upstream's read timeout: a stalled client does not hold a thread forever
    server: Server

    def log_message(self, *args):
        pass

    def do_POST(self):
        self.handle_request()

    def do_GET(self):
        self.handle_request()

    do_PUT = do_PATCH = do_DELETE = do_HEAD = do_GET

    def handle_request(self) -> None:
        entry = {"event": "request", "time": time.time(), "method": self.command, "path": self.path,
                 "namespace": None, "name": None, "authorized": None, "token_sha256": None,
                 "user_agent": self.headers.get("User-Agent"), "size": None, "forced": False, "body": None}
        try:
            raw = self.read_body()
            entry["size"] = len(raw)
            try:
                entry["body"] = json.loads(raw) if raw else None
            except ValueError:
                pass
            forced, message, delay = self.server.control.next()
            if delay > 0:
                self.server.record({**entry, "event": "delayed"})
                time.sleep(delay)  # the server's own slowness, on purpose
            if forced is not None:
                entry["forced"] = True
                if forced == 0:
                    self.server.record({**entry, "code": 0, "reason": "Dropped", "message": "connection dropped"})
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                raise Reply(forced, message or REASONS.get(forced, "Forced"))
            code, reply = 200, self.answer(raw, entry)
            self.send_json(code, reply)
            self.server.record({**entry, "code": code, "reason": None, "message": None})
        except Reply as error:
            status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                      "message": error.message, "reason": error.reason, "code": error.code}
            self.send_json(error.code, status)
            self.server.record({**entry, "code": error.code, "reason": error.reason, "message": error.message})

    def read_body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if length is not None:
            if not length.isdigit():
                raise Reply(400, "Bad Request")
            if int(length) > MAX_BODY:
                # Go's server discards up to 256 KiB of an unread body so the client gets the answer
                # (instead of a reset mid-upload); beyond that it closes the connection.
                if int(length) <= 256 * 1024:
                    self.rfile.read(int(length))
                else:
                    self.close_connection = True
                raise Reply(413, "Payload too large")
            return self.rfile.read(int(length))
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            data = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return data
                data += self.rfile.read(size)
                self.rfile.readline()
                if len(data) > MAX_BODY:  # Go's MaxBytesReader: the decoder fails, so a 422
                    self.close_connection = True
                    raise Reply(422, "Invalid payload")
        return b""

    def answer(self, raw: bytes, entry: dict) -> dict:
        match = ROUTE.match(self.path.split("?", 1)[0])
        if self.command != "POST" or not match:
            raise Reply(404, "Not found")
        namespace, name = entry["namespace"], entry["name"] = match.groups()
        token = self.bearer()
        entry["token_sha256"] = hashlib.sha256(token.encode()).hexdigest()[:12] if token else None
        expected = self.current_token()
        job = self.server.options.job
        entry["authorized"] = bool(token) and token == expected and (job is None or job == f"{namespace}/{name}")
        if not entry["authorized"]:
            raise Reply(403, "Forbidden")
        status = decode(raw)
        if status is None:
            return {}
        errors = validate(name, status)
        if errors:
            raise Reply(422, errors[0])
        return echo(status)

    def bearer(self) -> str:
        parts = self.headers.get("Authorization", "").split()
        return parts[1] if len(parts) == 2 and parts[0].lower() == "bearer" else ""

    def current_token(self) -> str | None:
        try:
            with open(self.server.options.token_file, encoding="utf-8") as file:
                return file.read().strip() or None
        except OSError:
            return None

    def send_json(self, code: int, body: dict) -> None:
        data = (json.dumps(body) + "\n").encode()
        try:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            pass


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--cert", help="server certificate (PEM); without it, plain HTTP")
    parser.add_argument("--key", help="server key (PEM)")
    parser.add_argument("--token-file", required=True)
    parser.add_argument("--record", required=True)
    parser.add_argument("--ready", required=True)
    parser.add_argument("--control")
    parser.add_argument("--job", help="NAMESPACE/NAME: the only TrainJob the token is good for")
    options = parser.parse_args(argv)
    server = Server(options)
    if options.cert:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(options.cert, options.key)
        # The handshake happens in the request's thread: a client that never completes it cannot stall accept().
        server.socket = context.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
    port = server.server_address[1]
    temporary = options.ready + ".tmp"
    with open(temporary, "w") as file:
        json.dump({"port": port, "pid": os.getpid()}, file)
    os.replace(temporary, options.ready)
    print(f"listening on {port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
