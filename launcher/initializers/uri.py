"""STORAGE_URI, parsed and checked. Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from launcher.core.outcome import ConfigError

SCHEMES = ("hf", "s3", "file", "https", "http")
_CONTRACT = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://.+$")


@dataclass(frozen=True)
class StorageUri:
    scheme: str
    authority: str  # hf: owner, s3: bucket, https: host[:port]
    path: str  # without the leading '/'
    raw: str

    @property
    def shown(self) -> str:
        return redact_uri(self.raw)


def redact_uri(uri: str) -> str:
    """The URI without credentials or query string (signed URLs carry secrets there)."""
    try:
        parts = urlsplit(uri)
    except ValueError:
        return "<unparseable URI>"
    netloc = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def parse_storage_uri(raw: str, allowed: tuple[str, ...] = SCHEMES, name: str = "STORAGE_URI") -> StorageUri:
    if len(raw) > 2048 or not _CONTRACT.match(raw):
        raise ConfigError(
            name, redact_uri(raw), "SCHEME://... of at most 2048 characters, e.g. hf://owner/name or s3://bucket/prefix"
        )
    try:
        parts = urlsplit(raw)
    except ValueError as error:  # s3://[ : an unclosed IPv6 bracket
        raise ConfigError(name, redact_uri(raw), f"a URI that parses ({error})") from None
    scheme = parts.scheme.lower()
    if scheme not in allowed:
        raise ConfigError(name, redact_uri(raw), f"one of the schemes {', '.join(s + '://' for s in allowed)}")
    if scheme == "hf":
        if "@" in parts.netloc:  # the owner would carry them, into every message naming the repo
            raise ConfigError(
                name, redact_uri(raw), "hf://OWNER/NAME[/SUBFOLDER] without credentials: the token goes in ACCESS_TOKEN"
            )
        segments = [s for s in f"{parts.netloc}{parts.path}".split("/") if s]
        if len(segments) < 2 or any(s in (".", "..") for s in segments):
            raise ConfigError(name, redact_uri(raw), "hf://OWNER/NAME[/SUBFOLDER]")
        return StorageUri("hf", segments[0], "/".join(segments[1:]), raw)
    if scheme == "s3":
        if not re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", parts.netloc):
            raise ConfigError(name, redact_uri(raw), "s3://BUCKET[/PREFIX] with a valid bucket name")
        return StorageUri("s3", parts.netloc, parts.path.lstrip("/"), raw)
    if scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise ConfigError(name, redact_uri(raw), "file:///ABSOLUTE/PATH")
        return StorageUri("file", "", parts.path, raw)
    if not parts.netloc or not parts.path.strip("/"):
        raise ConfigError(name, redact_uri(raw), f"{scheme}://HOST/PATH/TO/FILE")
    return StorageUri(scheme, parts.netloc, parts.path.lstrip("/"), raw)
