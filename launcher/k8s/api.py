"""A minimal Kubernetes API client for the few requests a pod makes about itself: in-cluster
configuration, JSON requests, and a watch read one event a line. Stdlib only (``http.client``,
``ssl``), so nothing heavy is imported when the feature that needs it is on, and nothing at all
when it is off.

In-cluster configuration, as client-go's ``rest.InClusterConfig`` finds it: the API server at
``KUBERNETES_SERVICE_HOST``:``KUBERNETES_SERVICE_PORT`` over https, the service account's
``token``, ``ca.crt`` and ``namespace`` in :data:`SERVICE_ACCOUNT_DIR` (``SERVICE_ACCOUNT_DIR_ENV``
points elsewhere, for tests). The token is re-read before each request (the kubelet rotates it)
and never appears in an error's text.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import ssl
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from launcher.core.outcome import ConfigError

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
# Where the service account's files are instead (tests: a stand-in API server's CA and token).
SERVICE_ACCOUNT_DIR_ENV = "TRAINER_LAUNCHER_SERVICE_ACCOUNT_DIR"
HOST_ENV, PORT_ENV = "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"
REQUEST_TIMEOUT = 10.0


class ApiError(Exception):
    """The API server answered with an error: its HTTP status and the Status object's reason and
    message (never a header of the request)."""

    def __init__(self, method: str, path: str, status: int, reason: str, message: str):
        self.status, self.reason = status, reason
        super().__init__(f"{method} {path}: {status} {reason}: {message}".rstrip(": "))


class Unreachable(Exception):
    """No answer from the API server (refused, reset, timed out, TLS failed)."""


@dataclass(frozen=True)
class InCluster:
    host: str
    port: int
    account_dir: Path
    namespace: str

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> InCluster:
        """The configuration a pod's service account gives; a ConfigError (one line) when the pod
        has no API server address or no service account mounted."""
        host = environ.get(HOST_ENV, "")
        if not host:
            raise ConfigError(HOST_ENV, None, "the API server's address, set by the kubelet in every pod")
        raw_port = environ.get(PORT_ENV, "443") or "443"
        if not raw_port.isdigit() or not 0 < int(raw_port) < 65536:
            raise ConfigError(PORT_ENV, raw_port, "a TCP port, 1..65535")
        account_dir = Path(environ.get(SERVICE_ACCOUNT_DIR_ENV) or SERVICE_ACCOUNT_DIR)
        namespace_file = account_dir / "namespace"
        try:
            namespace = namespace_file.read_text(encoding="utf-8").strip()
        except OSError as error:
            raise ConfigError(
                str(namespace_file),
                None,
                f"the pod's service account mounted ({error.strerror}; is automountServiceAccountToken false?)",
            ) from None
        if not namespace:
            raise ConfigError(str(namespace_file), "", "the pod's namespace")
        return cls(host.strip("[]"), int(raw_port), account_dir, namespace)

    @property
    def token_file(self) -> Path:
        return self.account_dir / "token"

    @property
    def ca_file(self) -> Path:
        return self.account_dir / "ca.crt"


class Client:
    """Requests to one API server as the pod's service account. Thread-safe: one connection per
    request (a pod makes a handful; a watch holds its own)."""

    def __init__(self, config: InCluster, timeout: float = REQUEST_TIMEOUT):
        self.config, self.timeout = config, timeout
        self._context: ssl.SSLContext | None = None

    def _ssl(self) -> ssl.SSLContext:
        if self._context is None:
            try:
                self._context = ssl.create_default_context(cafile=str(self.config.ca_file))
            except (OSError, ssl.SSLError) as error:
                raise Unreachable(f"cannot load the API server's CA {self.config.ca_file}: {error}") from None
        return self._context

    def _token(self) -> str:
        try:
            token = self.config.token_file.read_text(encoding="utf-8").strip()
        except OSError as error:
            raise Unreachable(f"cannot read the token {self.config.token_file}: {error.strerror}") from None
        if not token or any(c.isspace() for c in token):
            raise Unreachable(f"the service account token {self.config.token_file} is empty or not one token")
        return token

    def _send(
        self,
        method: str,
        path: str,
        query: Mapping[str, str] | None,
        body: bytes | None,
        content_type: str | None,
        timeout: float,
    ) -> tuple[http.client.HTTPSConnection, http.client.HTTPResponse]:
        url = path + ("?" + urllib.parse.urlencode(query) if query else "")
        headers = {
            "Authorization": "Bearer " + self._token(),
            "Accept": "application/json",
            "User-Agent": "trainer-launcher",
        }
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
        connection = http.client.HTTPSConnection(
            self.config.host, self.config.port, timeout=timeout, context=self._ssl()
        )
        try:
            connection.request(method, url, body=body, headers=headers)
            response = connection.getresponse()
        except (OSError, http.client.HTTPException) as error:
            connection.close()
            raise Unreachable(f"{method} {path}: {type(error).__name__}: {error}") from None
        if response.status >= 300:
            try:
                raw = response.read(65536)
            except (OSError, http.client.HTTPException):
                raw = b""
            finally:
                connection.close()
            status_reason, message = _status_of(raw)
            raise ApiError(method, path, response.status, status_reason or response.reason, message)
        return connection, response

    def request(
        self,
        method: str,
        path: str,
        query: Mapping[str, str] | None = None,
        body: object = None,
        content_type: str | None = None,
    ) -> dict:
        """One request, its JSON answer; ApiError or Unreachable."""
        data = None if body is None else json.dumps(body).encode()
        connection, response = self._send(method, path, query, data, content_type, self.timeout)
        try:
            answer = json.loads(response.read() or b"{}")
        except (OSError, http.client.HTTPException, ValueError) as error:
            raise Unreachable(f"{method} {path}: the answer was cut or not JSON ({error})") from None
        finally:
            connection.close()
        if not isinstance(answer, dict):
            raise Unreachable(f"{method} {path}: the answer is not a JSON object")
        return answer

    def watch(self, path: str, query: Mapping[str, str], timeout: float) -> Watch:
        """A watch (``query`` has ``watch=true``): its events as the server streams them; the
        socket gives up after ``timeout`` seconds of silence."""
        connection, response = self._send("GET", path, query, None, None, timeout)
        return Watch(connection, response, path)


class Watch:
    """The events of one watch request, one JSON object a line; ``close`` from another thread
    ends the iteration."""

    def __init__(self, connection: http.client.HTTPSConnection, response: http.client.HTTPResponse, path: str):
        self._connection, self._response, self._path = connection, response, path

    def __iter__(self) -> Iterator[dict]:
        try:
            while True:
                line = self._response.readline()
                if not line:
                    return
                if not line.strip():
                    continue
                event = json.loads(line)
                if not isinstance(event, dict):
                    raise ValueError("a watch event is a JSON object")
                yield event
        except (OSError, http.client.HTTPException, ValueError) as error:
            raise Unreachable(f"watch {self._path}: {type(error).__name__}: {error}") from None
        finally:
            self._connection.close()

    def close(self) -> None:
        """End the stream from another thread: the reading thread meets its end and closes."""
        sock = self._connection.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def _status_of(raw: bytes) -> tuple[str, str]:
    """A metav1.Status body's reason and message ('' when the body is not one)."""
    try:
        status = json.loads(raw)
    except ValueError:
        return "", raw[:200].decode("utf-8", "replace").strip()
    if not isinstance(status, dict):
        return "", ""
    return str(status.get("reason", "")), str(status.get("message", ""))
