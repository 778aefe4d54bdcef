"""What the engine checks a received file against: md5, sha256, git's blob sha1, or S3's
multipart ETag (the md5 of the parts' md5s, "-N"), computed as the bytes go by."""

from __future__ import annotations

import hashlib


class Checksum:
    """md5, sha256, git's blob sha1, or S3's multipart ETag (md5 of the parts' md5s, "-N")."""

    def __init__(self, kind: str | None, size: int | None):
        self.kind = kind
        self._part_size = int(kind.split(":")[1]) if kind and kind.startswith("s3-multipart:") else 0
        if self._part_size:
            self._hash, self._part, self._filled = None, hashlib.md5(), 0
            self._digests: list[bytes] = []
        elif kind == "git-sha1":
            self._hash = hashlib.sha1(f"blob {size}\0".encode())
        elif kind in ("md5", "sha256"):
            self._hash = hashlib.new(kind)
        else:
            self._hash = None

    def update(self, data: bytes | memoryview) -> None:
        if self._part_size:
            view = memoryview(data)
            while view:
                take = min(len(view), self._part_size - self._filled)
                self._part.update(view[:take])
                self._filled += take
                view = view[take:]
                if self._filled == self._part_size:
                    self._digests.append(self._part.digest())
                    self._part, self._filled = hashlib.md5(), 0
        elif self._hash is not None:
            self._hash.update(data)

    @property
    def part_size(self) -> int:
        """The multipart checksum's part size; 0 for any other kind."""
        return self._part_size

    def part_digests(self) -> list[bytes]:
        """A multipart checksum's parts so far, the last one possibly short."""
        return self._digests + ([self._part.digest()] if self._filled else [])

    def hexdigest(self) -> str | None:
        if self._part_size:
            return multipart_etag(self.part_digests())
        return self._hash.hexdigest() if self._hash is not None else None


def multipart_etag(digests: list[bytes]) -> str:
    """S3's ETag of a multipart object from its parts' md5 digests."""
    return f"{hashlib.md5(b''.join(digests)).hexdigest()}-{len(digests)}"
