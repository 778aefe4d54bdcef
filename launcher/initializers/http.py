"""Ranged HTTP GETs with errors sorted into transient and permanent (stdlib only).

Bodies go over keep-alive connections kept per thread and per origin (a new TCP, and for https a
new TLS handshake, per small file was most of the client's CPU), read with ``readinto`` into one
buffer per thread: no new bytes object per chunk.
"""

from __future__ import annotations

import http.client
import ssl
import threading
from collections.abc import Iterator
from functools import lru_cache
from urllib.error import HTTPError, URLError
from urllib.parse import urljoin, urlsplit
from urllib.request import Request, getproxies, proxy_bypass, urlopen

from launcher.core.outcome import Reasons
from launcher.initializers.errors import PermanentError, TransientError, refused_certificate

_PERMANENT = {
    400: Reasons.BAD_REQUEST,
    401: Reasons.AUTH_FAILED,
    403: Reasons.AUTH_FAILED,
    404: Reasons.NOT_FOUND,
    410: Reasons.NOT_FOUND,
}
_REDIRECTS = {301, 302, 303, 307, 308}
_MAX_REDIRECTS = 5
_TIMEOUT = 60.0
# A connection the server closed while it sat idle in the pool fails on first use in one of these ways.
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)

_local = threading.local()
TRUST = "SSL_CERT_FILE"  # the CA bundle this module's TLS trusts, when set (else the system's)


def classify_status(status: int, what: str) -> Exception:
    if status in _PERMANENT:
        return PermanentError(f"{what}: HTTP {status}", _PERMANENT[status])
    return TransientError(f"{what}: HTTP {status}")


def open_url(
    url: str,
    headers: dict[str, str],
    method: str = "GET",
    timeout: float = 60,
    what: str = "",
    credentials: dict[str, str] | None = None,
) -> http.client.HTTPResponse:
    """One request through urllib (proxies from the environment, redirects). ``credentials`` (e.g.
    Authorization) go to ``url``'s host only, never along a redirect (the Hub sends LFS files to a CDN
    on another origin)."""
    request = Request(url, headers=headers, method=method)
    for name, value in (credentials or {}).items():
        request.add_unredirected_header(name, value)
    try:
        return urlopen(request, timeout=timeout)
    except HTTPError as error:
        raise classify_status(error.code, what or url) from None
    except (TimeoutError, URLError, OSError, http.client.HTTPException) as error:
        cause = getattr(error, "reason", error)
        raise refused_certificate(cause, what or url, TRUST) or TransientError(f"{what or url}: {cause}") from None


def _origin(url: str) -> tuple[str, str, int]:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or (443 if scheme == "https" else 80)


@lru_cache(maxsize=64)
def _proxied(scheme: str, host: str) -> bool:
    """A proxy from the environment (HTTP(S)_PROXY, NO_PROXY) applies: keep urllib, which talks to it."""
    return bool(getproxies().get(scheme)) and not proxy_bypass(host)


def _pool() -> dict:
    pool = getattr(_local, "connections", None)
    if pool is None:
        pool = _local.connections = {}
    return pool


def _connect(origin: tuple[str, str, int]) -> http.client.HTTPConnection:
    scheme, host, port = origin
    if scheme == "https":
        context = getattr(_local, "tls", None)
        if context is None:  # system CA store, hostname checked; built once per thread (it is costly)
            context = _local.tls = ssl.create_default_context()
        return http.client.HTTPSConnection(host, port, timeout=_TIMEOUT, context=context)
    if scheme != "http":
        raise PermanentError(f"unsupported URL scheme {scheme!r}", Reasons.BAD_REQUEST)
    return http.client.HTTPConnection(host, port, timeout=_TIMEOUT)


def _request(url: str, headers: dict[str, str], what: str):
    """(connection, response) for a GET of ``url``; a pooled connection that went stale is replaced once."""
    origin = _origin(url)
    parts = urlsplit(url)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    pooled = _pool().pop(origin, None)
    for connection in ([pooled] if pooled else []) + [None]:
        reused = connection is not None
        connection = connection or _connect(origin)
        try:
            connection.request("GET", target, headers=headers)
            return connection, connection.getresponse()
        except _STALE as error:
            connection.close()
            if not reused:
                raise TransientError(f"{what}: {type(error).__name__}") from None
        except (OSError, http.client.HTTPException) as error:
            connection.close()
            said = getattr(error, "strerror", None) or type(error).__name__
            raise refused_certificate(error, what, TRUST) or TransientError(f"{what}: {said}") from None
    raise AssertionError("unreachable")


def _release(origin, connection: http.client.HTTPConnection, response: http.client.HTTPResponse) -> None:
    """Back to the pool when the body was read to its end and the server keeps the connection open."""
    if response.isclosed() and not response.will_close and connection.sock is not None:
        old = _pool().pop(origin, None)
        if old is not None:
            old.close()
        _pool()[origin] = connection
    else:
        connection.close()


def _drain(response: http.client.HTTPResponse, limit: int = 1 << 16) -> None:
    """Read a small redirect/error body so the connection can be reused; a big one is not worth it."""
    length = response.length
    if length is not None and length <= limit:
        response.read()


def get_range(
    url: str,
    headers: dict[str, str],
    start: int,
    chunk_size: int,
    what: str,
    credentials: dict[str, str] | None = None,
    end: int | None = None,
) -> Iterator[bytes | memoryview]:
    """Bytes [start, end) of the body. A server that ignores Range gets the rest skipped.

    Yields views of one buffer that is refilled for the next chunk: the caller must write/hash each
    chunk before asking for the next one (the engine does), and must not keep a reference to it."""
    request_headers = dict(headers)
    if start or end is not None:
        request_headers["Range"] = f"bytes={start}-{'' if end is None else end - 1}"
    if _proxied(*_origin(url)[:2]):
        yield from _get_range_urllib(url, request_headers, start, what, credentials, end, chunk_size)
        return
    home = _origin(url)
    for _ in range(_MAX_REDIRECTS + 1):
        origin = _origin(url)
        # Credentials go to the origin they were given for, never to where a redirect points.
        sent = {**request_headers, **(credentials or {})} if origin == home else request_headers
        connection, response = _request(url, sent, what)
        if response.status in _REDIRECTS and response.getheader("Location"):
            url = urljoin(url, response.getheader("Location"))
            _drain(response)
            _release(origin, connection, response)
            continue
        break
    else:
        raise TransientError(f"{what}: more than {_MAX_REDIRECTS} redirects")
    if response.status not in (200, 206):
        _drain(response)
        _release(origin, connection, response)
        raise classify_status(response.status, what)
    buffer = getattr(_local, "buffer", None)
    _local.buffer = None  # taken: a nested get_range on this thread gets its own
    if buffer is None or len(buffer) != chunk_size:
        buffer = bytearray(chunk_size)
    view = memoryview(buffer)
    finished = False
    try:

        def chunks() -> Iterator[memoryview]:
            while n := _read_body(response.readinto, view, what):
                yield view[:n]

        yield from _window(
            chunks(), start if start and response.status != 206 else 0, None if end is None else end - start
        )
        finished = True
    finally:
        _local.buffer = buffer
        if finished:
            _release(origin, connection, response)
        else:  # the consumer stopped or the body broke: the rest of it is still on the wire
            connection.close()


def _get_range_urllib(url, request_headers, start, what, credentials, end, chunk_size) -> Iterator[bytes]:
    response = open_url(url, request_headers, what=what, credentials=credentials)
    try:

        def chunks() -> Iterator[bytes]:
            while chunk := _read_body(response.read, chunk_size, what):
                yield chunk

        yield from _window(
            chunks(), start if start and response.status != 206 else 0, None if end is None else end - start
        )
    finally:
        response.close()


def _read_body(read, argument, what: str):
    """One read of a response body; a broken connection is transient."""
    try:
        return read(argument)
    except (OSError, http.client.HTTPException) as error:
        raise TransientError(f"{what}: connection lost mid-body ({type(error).__name__})") from None


def _window(chunks: Iterator, skip: int, left: int | None) -> Iterator:
    """Bytes [skip, skip + left) of ``chunks``: a server that ignored Range sent the start too."""
    for chunk in chunks:
        if skip:
            cut = min(skip, len(chunk))
            chunk, skip = chunk[cut:], skip - cut
        if left is not None:
            chunk = chunk[:left]
            left -= len(chunk)
        if chunk:
            yield chunk
        if left == 0:
            return
