"""s3://BUCKET/PREFIX: the files as objects under the prefix, the manifest last.

The credentials, endpoint, CA bundle and role are the s3:// initializer's (launcher.initializers.s3),
and so is the client split: boto3 lists and deletes, obstore (Rust) carries the bodies. A file up to
one part is a single PUT, on as many lanes as the concurrency; the bigger ones go up in parts, two
files at a time with half the lanes each, so that one file's completion (S3 assembles the object)
overlaps the other's parts: memory stays about 2 * concurrency * part size. S3
answers each upload with its ETag, the md5 of what it stored (or of its parts' md5s): it must equal
the file's own, or the file is sent again. A rerun lists the prefix first and sends only the files
whose size or ETag differ."""

from __future__ import annotations

import threading
from pathlib import Path

from launcher.export.checksum import digest
from launcher.export.engine import each
from launcher.export.tree import MANIFEST, LocalFile
from launcher.initializers.errors import TransientError
from launcher.initializers.progress import Progress
from launcher.initializers.uri import StorageUri

MIB = 1 << 20
PART_FLOOR = 16 * MIB  # S3 allows 10,000 parts: the part size grows with the file from here


def part_size(size: int) -> int:
    return max(PART_FLOOR, -(-size // (9000 * MIB)) * MIB)


class S3Target:
    def __init__(self, uri: StorageUri, settings, subpath: str, concurrency: int):
        from launcher.initializers.s3 import S3Source

        self.bucket, self.lanes = uri.authority, concurrency
        self.prefix = "/".join(p for p in (uri.path.strip("/"), subpath) if p)
        self.shown = f"s3://{self.bucket}/{self.prefix}".rstrip("/")
        self.source = S3Source(StorageUri("s3", self.bucket, self.prefix, self.shown), settings)

    def key(self, path: str) -> str:
        return f"{self.prefix}/{path}" if self.prefix else path

    def forms(self, file: LocalFile, there: dict) -> tuple[tuple[str, ...], int]:
        return ("s3-etag",), part_size(file.size)

    def existing(self) -> dict[str, dict]:
        client, base = self.source.client, f"{self.prefix}/" if self.prefix else ""

        def page_through() -> list[dict]:
            paginator = client.get_paginator("list_objects_v2")
            return [o for page in paginator.paginate(Bucket=self.bucket, Prefix=base) for o in page.get("Contents", [])]

        found = self.source.call(page_through, f"list {self.shown}")
        return {o["Key"][len(base) :]: {"size": o["Size"], "s3-etag": o.get("ETag", "").strip('"')} for o in found}

    def same(self, there: dict, file: LocalFile, digests: dict[str, str]) -> bool:
        return there["size"] == file.size and there["s3-etag"] == digests["s3-etag"]

    def begin(self, existing: dict[str, dict]) -> None:
        if MANIFEST in existing:
            key = self.key(MANIFEST)
            self.source.call(
                lambda: self.source.client.delete_object(Bucket=self.bucket, Key=key), f"delete {self.shown}/{MANIFEST}"
            )

    def send(self, files: list[LocalFile], digests: dict[str, dict[str, str]], progress: Progress) -> None:
        small = [f for f in files if f.size <= part_size(f.size)]
        large = [f for f in files if f.size > part_size(f.size)]
        stop, failed = threading.Event(), []

        at_once = min(2, len(large), self.lanes)
        per_file = max(1, self.lanes // max(1, at_once))

        def lane_of_parts() -> None:  # the large files two at a time, the lanes shared between them
            try:
                each(large, lambda f: self._put(f, digests, per_file), at_once, progress, stop=stop)
            except BaseException as error:  # noqa: BLE001 - raised again below, in the caller's thread
                stop.set()
                failed.append(error)

        parts = threading.Thread(target=lane_of_parts, daemon=True)
        parts.start()
        try:
            each(small, lambda f: self._put(f, digests, 1), self.lanes, progress, stop=stop)
        finally:
            parts.join()
        if failed:
            raise failed[0]

    def _put(self, file: LocalFile, digests: dict[str, dict[str, str]], lanes: int) -> None:
        """One file, hashed while it goes up, then verified by the ETag S3 answers."""
        import obstore

        from launcher.initializers.s3 import obstore_error

        key, part = self.key(file.path), part_size(file.size)
        hashed: list = []
        hashing = threading.Thread(target=lambda: hashed.append(_digest_or_error(file, part)), daemon=True)
        hashing.start()
        try:
            result = obstore.put(
                self.source.body_store(),
                key,
                Path(file.real),
                use_multipart=file.size > part,
                chunk_size=part,
                max_concurrency=lanes,
            )
        except Exception as error:  # noqa: BLE001 - sorted into transient and permanent
            raise obstore_error(error, f"put {key}") from None
        finally:
            hashing.join()
        if isinstance(hashed[0], BaseException):
            raise hashed[0]
        digests[file.path] = hashed[0]
        etag, expected = (result.get("e_tag") or "").strip('"'), hashed[0]["s3-etag"]
        if etag != expected:
            raise TransientError(f"{key}: S3 stored ETag {etag or 'none'}, the file's is {expected}")

    def finish(self, files: list[LocalFile], digests: dict[str, dict[str, str]], manifest: bytes) -> None:
        import obstore

        from launcher.initializers.s3 import obstore_error

        key = self.key(MANIFEST)
        try:
            obstore.put(self.source.body_store(), key, manifest, use_multipart=False)
        except Exception as error:  # noqa: BLE001
            raise obstore_error(error, f"put {key}") from None


def _digest_or_error(file: LocalFile, part: int):
    try:
        return digest(file.real, file.size, ("s3-etag",), part)
    except BaseException as error:  # noqa: BLE001 - raised in the uploading thread
        return error
