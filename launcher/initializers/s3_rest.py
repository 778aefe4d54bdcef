"""S3's listing and the size of a multipart object's parts, in the standard library, signed with
SigV4. With the keys given (ACCESS_KEY_ID and SECRET_ACCESS_KEY, the Trainer's S3 initializer),
the download never loads boto3: its imports and its model of S3 take 0.7 s of CPU before the first
request, most of a small tree's time (bench/bench_init.py --tree small). Any other credentials
(ROLE_ARN, boto3's own chain) still go through boto3, which knows them all.

Requests go through urllib: proxies from the environment (HTTP(S)_PROXY, NO_PROXY), no redirect
followed (a signature is for one host), AWS_CA_BUNDLE trusted besides the system's CAs.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import ssl
import time
import urllib.parse
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable
from datetime import UTC, datetime
from urllib.error import HTTPError, URLError
from urllib.request import AbstractHTTPHandler, HTTPRedirectHandler, HTTPSHandler, Request, build_opener

from launcher import __version__
from launcher.core.outcome import Reasons
from launcher.initializers.errors import PermanentError, TransientError, refused_certificate

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"
_UNRESERVED = "-_.~"  # with letters and digits: what SigV4 never percent-encodes
_ATTEMPTS = 3  # as boto3's standard retry mode
_TIMEOUT = 60.0


def sign(
    method: str, url: str, region: str, key_id: str, secret: str, now: datetime, session_token: str | None = None
) -> dict[str, str]:
    """The headers that sign a request with no body (AWS Signature Version 4, service s3): Host,
    X-Amz-Date, X-Amz-Content-Sha256, the token if any, and Authorization. ``url``'s path is sent
    as it is written (already percent-encoded); its query is encoded here as SigV4 wants it."""
    parts = urllib.parse.urlsplit(url)
    amz_date = now.strftime("%Y%m%dT%H%M%SZ")
    headers = {"host": parts.netloc, "x-amz-content-sha256": EMPTY_SHA256, "x-amz-date": amz_date}
    if session_token:
        headers["x-amz-security-token"] = session_token
    query = sorted(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
    canonical = "\n".join(
        [
            method,
            parts.path or "/",
            "&".join(f"{_quote(name)}={_quote(value)}" for name, value in query),
            "".join(f"{name}:{headers[name]}\n" for name in sorted(headers)),
            ";".join(sorted(headers)),
            EMPTY_SHA256,
        ]
    )
    scope = f"{amz_date[:8]}/{region}/s3/aws4_request"
    to_sign = f"AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
    key = f"AWS4{secret}".encode()
    for word in (amz_date[:8], region, "s3", "aws4_request"):
        key = hmac.new(key, word.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={key_id}/{scope}, SignedHeaders={';'.join(sorted(headers))}, "
        f"Signature={signature}"
    )
    return headers


def _quote(text: str) -> str:
    return urllib.parse.quote(text, safe=_UNRESERVED)


class _NoRedirect(HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):  # the signature holds for this host only
        return None


class _PlainOnly(HTTPSHandler):
    """In place of urllib's own HTTPS handler, which makes a TLS context as it is built (3.12+)."""

    def __init__(self):
        AbstractHTTPHandler.__init__(self)

    def https_open(self, req):
        raise URLError("an https:// URL, where the endpoint is http://")


class S3Rest:
    """ListObjectsV2 and HEAD, for one bucket, with the keys given."""

    def __init__(
        self,
        bucket: str,
        key_id: str,
        secret: str,
        region: str,
        endpoint: str | None,
        ca_bundle: str | None,
        classify: Callable[[int, str, str], Exception],
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.bucket, self._key_id, self._secret, self.region = bucket, key_id, secret, region
        self._endpoint, self._classify, self._sleep = endpoint, classify, sleep
        tls: HTTPSHandler = _PlainOnly()
        # A plain http:// endpoint (MinIO or moto in the cluster) needs no TLS context: loading the
        # system's CAs costs about 0.08 s, before the listing. A bundle named is checked anyway.
        if ca_bundle or not (endpoint or "").lower().startswith("http://"):
            context = ssl.create_default_context()
            if ca_bundle:
                try:
                    context.load_verify_locations(ca_bundle)
                except (OSError, ssl.SSLError) as error:  # SSLError: no certificate in it
                    said = error.strerror if not isinstance(error, ssl.SSLError) else "no PEM certificate in it"
                    raise PermanentError(f"AWS_CA_BUNDLE={ca_bundle}: {said}", Reasons.CONFIG_ERROR) from None
            tls = HTTPSHandler(context=context)
        self._opener = build_opener(tls, _NoRedirect())

    def _url(self, key: str | None, query: dict[str, str]) -> str:
        """Path style with an endpoint (MinIO, Ceph, moto); virtual-hosted on AWS, as boto3 (path
        style there too for a bucket whose name has a dot, which no wildcard certificate covers)."""
        path = urllib.parse.quote(key, safe="/~") if key is not None else ""
        if self._endpoint:
            base = f"{self._endpoint.rstrip('/')}/{urllib.parse.quote(self.bucket, safe='')}"
            where = f"{base}/{path}" if key is not None else base
        elif "." in self.bucket:
            where = f"https://s3.{self.region}.amazonaws.com/{self.bucket}/{path}"
        else:
            where = f"https://{self.bucket}.s3.{self.region}.amazonaws.com/{path}"
        return f"{where}?{urllib.parse.urlencode(query, quote_via=urllib.parse.quote)}" if query else where

    def _send(self, method: str, key: str | None, query: dict[str, str], what: str) -> tuple[dict, bytes]:
        """One signed request, tried again on what boto3 would retry; (headers, body)."""
        attempt = 0
        while True:
            attempt += 1
            try:
                return self._send_once(method, key, query, what)
            except TransientError:
                if attempt >= _ATTEMPTS:
                    raise
                self._sleep(0.1 * 2**attempt)

    def _send_once(self, method: str, key: str | None, query: dict[str, str], what: str) -> tuple[dict, bytes]:
        url = self._url(key, query)
        headers = sign(method, url, self.region, self._key_id, self._secret, datetime.now(UTC))
        headers["user-agent"] = f"trainer-launcher/{__version__}"
        try:
            with self._opener.open(Request(url, headers=headers, method=method), timeout=_TIMEOUT) as response:
                return dict(response.headers), response.read()
        except HTTPError as error:
            body = error.read() if method != "HEAD" else b""
            region = error.headers.get("x-amz-bucket-region")
            if region and region != self.region and not self._endpoint:  # the bucket lives elsewhere
                self.region = region
                return self._send_once(method, key, query, what)
            raise self._classify(error.code, _error_code(body) or str(error.code), what) from None
        except (TimeoutError, URLError, OSError, http.client.HTTPException) as error:
            cause = getattr(error, "reason", error)
            refused = refused_certificate(cause, what, "AWS_CA_BUNDLE")
            raise refused or TransientError(f"{what}: {type(cause).__name__}") from None

    def listing(self, prefix: str, page: int = 1000) -> list[tuple[str, int, str]]:
        """Every object under ``prefix`` as S3 names it: (key, size, ETag without its quotes).
        Keys come URL-encoded (encoding-type=url: XML carries no control character) and are decoded
        as S3 encodes them. ``page``: keys a reply holds at most (S3's own limit is 1,000)."""
        found: list[tuple[str, int, str]] = []
        query = {"list-type": "2", "prefix": prefix, "encoding-type": "url", "max-keys": str(page)}
        while True:
            _, body = self._send("GET", None, query, f"list s3://{self.bucket}/{prefix}")
            try:
                reply = ElementTree.fromstring(body)
            except ElementTree.ParseError:
                raise TransientError(f"list s3://{self.bucket}/{prefix}: a listing that is not XML") from None
            for item in reply.iter(f"{_NS}Contents"):
                found.append(
                    (
                        urllib.parse.unquote_plus(item.findtext(f"{_NS}Key", "")),
                        int(item.findtext(f"{_NS}Size", "0")),
                        item.findtext(f"{_NS}ETag", "").strip('"'),
                    )
                )
            token = reply.findtext(f"{_NS}NextContinuationToken")
            if reply.findtext(f"{_NS}IsTruncated") != "true" or not token:
                return found
            query = {**query, "continuation-token": token}

    def part_size(self, key: str) -> int | None:
        """The size of a multipart object's first part (HEAD with partNumber=1)."""
        headers, _ = self._send("HEAD", key, {"partNumber": "1"}, f"head {key}")
        size = {name.lower(): value for name, value in headers.items()}.get("content-length", "")
        return int(size) if size.isdigit() and int(size) > 0 else None


def _error_code(body: bytes) -> str:
    try:
        return ElementTree.fromstring(body).findtext("Code") or ""
    except ElementTree.ParseError:
        return ""
