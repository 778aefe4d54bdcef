"""Ranged HTTP GETs with errors sorted into transient and permanent (stdlib only)."""

from __future__ import annotations

import http.client
import socket
from typing import Iterator
from urllib.error import HTTPError, URLError
from urllib.request import Request, urlopen

from launcher.initializers.engine import PermanentError, TransientError

_PERMANENT = {400: "BadRequest", 401: "AuthFailed", 403: "AuthFailed", 404: "NotFound", 410: "NotFound"}


def classify_status(status: int, what: str) -> Exception:
    if status in _PERMANENT:
        return PermanentError(f"{what}: HTTP {status}", _PERMANENT[status])
    return TransientError(f"{what}: HTTP {status}")


def open_url(url: str, headers: dict[str, str], method: str = "GET", timeout: float = 60, what: str = "",
             credentials: dict[str, str] | None = None) -> http.client.HTTPResponse:
    """``credentials`` (e.g. Authorization) go to ``url``'s host only, never along a redirect (the
    Hub sends LFS files to a CDN on another origin)."""
    request = Request(url, headers=headers, method=method)
    for name, value in (credentials or {}).items():
        request.add_unredirected_header(name, value)
    try:
        return urlopen(request, timeout=timeout)
    except HTTPError as error:
        raise classify_status(error.code, what or url) from None
    except (URLError, OSError, http.client.HTTPException, socket.timeout) as error:
        raise TransientError(f"{what or url}: {getattr(error, 'reason', error)}") from None


def get_range(url: str, headers: dict[str, str], start: int, chunk_size: int, what: str,
              credentials: dict[str, str] | None = None, end: int | None = None) -> Iterator[bytes]:
    """Bytes [start, end) of the body. A server that ignores Range gets the rest skipped."""
    request_headers = dict(headers)
    if start or end is not None:
        request_headers["Range"] = f"bytes={start}-{'' if end is None else end - 1}"
    left = None if end is None else end - start
    response = open_url(url, request_headers, what=what, credentials=credentials)
    try:
        skip = start if start and response.status != 206 else 0
        while True:
            try:
                chunk = response.read(chunk_size)
            except (OSError, http.client.HTTPException) as error:
                raise TransientError(f"{what}: connection lost mid-body ({type(error).__name__})") from None
            if not chunk:
                return
            if skip:
                cut = min(skip, len(chunk))
                chunk, skip = chunk[cut:], skip - cut
                if not chunk:
                    continue
            if left is not None:
                chunk, left = chunk[:left], left - min(left, len(chunk))
            if chunk:
                yield chunk
            if left == 0:
                return
    finally:
        response.close()
