"""A stand-in for the Kubernetes API server, serving exactly the requests of JobSet's in-place
restart agent and nothing else, since no API server can run here. Written from kubernetes-sigs/
jobset v0.12.0 (commit f22e565ac3cc): ``cmd/in-place-restart-agent/main.go`` (the requests, made by
controller-runtime's cache and client), ``pkg/controllers/in_place_restart.go`` (how the
controller moves the JobSet's status from its pods' annotations) and keps/467-InPlaceRestart.

Served, over https with a test CA and a bearer token read from the service account's token file:

- ``GET /apis/jobset.x-k8s.io/v1alpha2/namespaces/NS/jobsets?fieldSelector=metadata.name=NAME``:
  a JobSetList holding the JobSet (or none), with the list's resourceVersion;
- the same with ``watch=true&resourceVersion=RV`` (and ``allowWatchBookmarks``, ``timeoutSeconds``):
  a chunked stream of watch events, one JSON object a line, from RV on; an ERROR event with a
  410 Status when RV is older than what the stand-in keeps (``expire()``);
- ``PATCH /api/v1/namespaces/NS/pods/POD?fieldManager=M&force=true`` with
  ``Content-Type: application/apply-patch+yaml``: the pod's annotations; then the controller's
  rule: every pod at one attempt makes it ``currentInPlaceRestartAttempt``, otherwise
  ``previousInPlaceRestartAttempt`` becomes the highest attempt - 1 (only ever upward).

Anything else is a 404 or 405; a missing or wrong token a 401; ``forbid(verb)`` makes that verb
a 403 as RBAC would. Every request is recorded (``requests``), its Authorization header too.
Runs on threads of the test's process: the test steers it (``annotate`` stands for the other pods'
agents) and reads what it saw.
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ATTEMPT = "jobset.sigs.k8s.io/in-place-restart-attempt"
JOBSETS = re.compile(r"^/apis/jobset\.x-k8s\.io/v1alpha2/namespaces/([^/]+)/jobsets$")
POD = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)$")


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    code: int = 0


@dataclass
class _State:
    namespace: str
    jobset: dict
    pods: dict[str, dict[str, str]]  # pod name -> its annotations
    version: int = 1
    floor: int = 0  # watches from a version below this get 410
    events: list[tuple[int, dict]] = field(default_factory=list)


class JobSetServer:
    def __init__(self, certs: tuple[Path, Path, Path], token_file: Path, namespace: str, jobset: str,
                 pods: list[str], restart_strategy: str = "InPlaceRestart"):
        self._token_file = token_file
        self.requests: list[Request] = []
        self.watching = 0  # watches open now
        self._forbidden: set[str] = set()
        self._lock = threading.Condition()
        self._closing = False
        self._generation = 0  # end_watches() ends the watches of older generations
        spec = {"failurePolicy": {"maxRestarts": 3, "restartStrategy": restart_strategy},
                "replicatedJobs": [{"name": "node", "replicas": 1,
                                    "template": {"spec": {"parallelism": len(pods), "completions": len(pods)}}}]}
        js = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
              "metadata": {"name": jobset, "namespace": namespace, "annotations": {}}, "spec": spec, "status": {}}
        self._state = _State(namespace, js, {pod: {} for pod in pods})
        self._stamp()
        handler = type("Handler", (_Handler,), {"owner": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(str(certs[1]), str(certs[2]))
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        with self._lock:
            self._closing = True
            self._lock.notify_all()
        self._server.shutdown()
        self._server.server_close()

    # --- steering, as the controller and the other pods' agents would ----------------------------

    def annotate(self, pod: str, attempt: int) -> None:
        """Another pod's agent announcing its attempt."""
        with self._lock:
            self._state.pods[pod][ATTEMPT] = str(attempt)
            self._reconcile()

    def set_jobset(self, change) -> None:
        """Change the JobSet (``change(jobset_dict)``) and tell the watches."""
        with self._lock:
            change(self._state.jobset)
            self._changed()

    def expire(self) -> None:
        """Forget every version so far: a watch from one of them gets 410 Gone."""
        with self._lock:
            self._state.floor = self._state.version + 1

    def end_watches(self) -> None:
        """End every open watch, as the API server does at its timeoutSeconds."""
        with self._lock:
            self._generation += 1
            self._lock.notify_all()

    def forbid(self, verb: str) -> None:
        self._forbidden.add(verb)

    @property
    def status(self) -> dict:
        with self._lock:
            return copy.deepcopy(self._state.jobset["status"])

    def annotations(self, pod: str) -> dict[str, str]:
        with self._lock:
            return dict(self._state.pods[pod])

    def wait_for(self, predicate, timeout: float = 30, what: str = "the stand-in"):
        end = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > end:
                seen = [(r.method, r.path, r.code) for r in self.requests]
                raise AssertionError(f"timed out waiting for {what}; requests: {seen}")
            time.sleep(0.01)

    # --- the controller's rule (pkg/controllers/in_place_restart.go) -------------------------------

    def _reconcile(self) -> None:
        attempts = [int(a[ATTEMPT]) for a in self._state.pods.values() if ATTEMPT in a]
        status = self._state.jobset["status"]
        if len(attempts) == len(self._state.pods) and len(set(attempts)) == 1:
            if status.get("currentInPlaceRestartAttempt") != attempts[0]:
                status["currentInPlaceRestartAttempt"] = attempts[0]
                self._changed()
            return
        if not attempts or max(attempts) == 0:
            return
        previous = max(attempts) - 1
        if status.get("previousInPlaceRestartAttempt") is None or previous > status["previousInPlaceRestartAttempt"]:
            status["previousInPlaceRestartAttempt"] = previous
            self._changed()

    def _changed(self) -> None:
        self._state.version += 1
        self._stamp()
        event = {"type": "MODIFIED", "object": copy.deepcopy(self._state.jobset)}
        self._state.events.append((self._state.version, event))
        self._lock.notify_all()

    def _stamp(self) -> None:
        self._state.jobset["metadata"]["resourceVersion"] = str(self._state.version)

    # --- serving ---------------------------------------------------------------------------------------

    def _authorized(self, headers) -> bool:
        return headers.get("Authorization") == "Bearer " + self._token_file.read_text().strip()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    owner: JobSetServer

    def log_message(self, *args):
        pass

    def _begin(self) -> Request:
        parsed = urllib.parse.urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        request = Request(self.command, parsed.path, dict(urllib.parse.parse_qsl(parsed.query)),
                          dict(self.headers.items()), self.rfile.read(length) if length else b"")
        self.owner.requests.append(request)
        return request

    def _answer(self, request: Request, code: int, body: dict) -> None:
        request.code = code
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _status(self, request: Request, code: int, reason: str, message: str) -> None:
        self._answer(request, code, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                     "reason": reason, "message": message, "code": code})

    def _refused(self, request: Request, verb: str) -> bool:
        if not self.owner._authorized(self.headers):
            self._status(request, 401, "Unauthorized", "Unauthorized")
            return True
        if verb in self.owner._forbidden:
            self._status(request, 403, "Forbidden", f"cannot {verb} here")
            return True
        return False

    def do_GET(self):
        request = self._begin()
        match = JOBSETS.match(request.path)
        state = self.owner._state
        name = state.jobset["metadata"]["name"]
        if not match or match.group(1) != state.namespace:
            return self._status(request, 404, "NotFound", "the server could not find the requested resource")
        watch = request.query.get("watch") == "true"
        if self._refused(request, "watch" if watch else "list"):
            return
        if request.query.get("fieldSelector") != f"metadata.name={name}":
            return self._status(request, 400, "BadRequest", "the agent selects its JobSet by metadata.name")
        if watch:
            return self._watch(request)
        with self.owner._lock:
            items = [copy.deepcopy(state.jobset)]
            version = str(state.version)
        self._answer(request, 200, {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSetList",
                                    "metadata": {"resourceVersion": version}, "items": items})

    def _watch(self, request: Request) -> None:
        owner, state = self.owner, self.owner._state
        since = int(request.query.get("resourceVersion") or 0)
        end = time.monotonic() + int(request.query.get("timeoutSeconds") or 60)
        request.code = 200
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        with owner._lock:
            owner.watching += 1
            generation = owner._generation
        try:
            if since < state.floor:
                gone = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired",
                        "message": f"too old resource version: {since}", "code": 410}
                self._chunk({"type": "ERROR", "object": gone})
                return
            while True:
                with owner._lock:
                    fresh = [event for version, event in state.events if version > since]
                    if not fresh:
                        if owner._closing or owner._generation != generation or time.monotonic() >= end:
                            return
                        owner._lock.wait(0.2)
                        continue
                    since = state.events[-1][0]
                for event in fresh:
                    self._chunk(event)
        except OSError:
            pass  # the client went away
        finally:
            with owner._lock:
                owner.watching -= 1
            with contextlib.suppress(OSError):
                self.wfile.write(b"0\r\n\r\n")
            self.close_connection = True

    def _chunk(self, event: dict) -> None:
        data = json.dumps(event).encode() + b"\n"
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def do_PATCH(self):
        request = self._begin()
        match = POD.match(request.path)
        owner, state = self.owner, self.owner._state
        if not match or match.group(1) != state.namespace or match.group(2) not in state.pods:
            return self._status(request, 404, "NotFound", "pods not found")
        if self._refused(request, "patch"):
            return
        if request.headers.get("Content-Type") != "application/apply-patch+yaml":
            return self._status(request, 415, "UnsupportedMediaType", "the agent patches by server-side apply")
        if not request.query.get("fieldManager") or request.query.get("force") != "true":
            return self._status(request, 400, "BadRequest", "apply needs a fieldManager, and force for the agent")
        patch = json.loads(request.body)
        annotations = patch["metadata"]["annotations"]
        with owner._lock:
            state.pods[match.group(2)].update(annotations)
            owner._reconcile()
            pod = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": match.group(2), "namespace": state.namespace,
                                "annotations": dict(state.pods[match.group(2)])}}
        self._answer(request, 200, pod)

    def do_POST(self):
        request = self._begin()
        self._status(request, 405, "MethodNotAllowed", "the agent never posts")

    def do_PUT(self):
        self.do_POST()

    def do_DELETE(self):
        self.do_POST()
