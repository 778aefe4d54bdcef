"""What a file's bytes hash to, in the forms the destinations compare: md5 (S3's ETag of a single
PUT, and the file target's check of its copy), S3's multipart ETag (the md5 of the parts' md5s,
"-N"), sha256 (an LFS object on the Hub) and git's blob sha1 (a regular file on the Hub).

One read per file, whatever the forms asked: hashlib releases the GIL over large buffers, so the
export's threads hash on every core."""

from __future__ import annotations

import hashlib

from launcher.initializers.errors import local_source_error

_READ = 8 << 20


def multipart_etag(part_md5s: list[bytes]) -> str:
    return f"{hashlib.md5(b''.join(part_md5s)).hexdigest()}-{len(part_md5s)}"


def digest(path: str, size: int, forms: tuple[str, ...], part_size: int = 0) -> dict[str, str]:
    """The file's hex digests by form ("md5", "s3-etag", "sha256", "git-sha1"). "s3-etag" is what
    S3 answers for an upload in parts of ``part_size`` (a single PUT's md5 below it)."""
    whole = {"md5"} if "s3-etag" in forms and size <= part_size else set()  # a single PUT's ETag is the md5
    hashes = {form: hashlib.new(form) for form in ("md5", "sha256") if form in forms or form in whole}
    if "git-sha1" in forms:
        hashes["git-sha1"] = hashlib.sha1(b"blob %d\0" % size)
    parts: list[bytes] = []
    part, filled = (hashlib.md5(), 0) if "s3-etag" in forms and size > part_size else (None, 0)
    try:
        with open(path, "rb") as handle:
            while chunk := handle.read(_READ):
                for h in hashes.values():
                    h.update(chunk)
                view = memoryview(chunk)
                while part is not None and view:
                    take = min(len(view), part_size - filled)
                    part.update(view[:take])
                    filled += take
                    view = view[take:]
                    if filled == part_size:
                        parts.append(part.digest())
                        part, filled = hashlib.md5(), 0
    except OSError as error:
        raise local_source_error(path, error) from None
    found = {form: h.hexdigest() for form, h in hashes.items()}
    if "s3-etag" in forms:
        if size > part_size:
            if filled:
                parts.append(part.digest())
            found["s3-etag"] = multipart_etag(parts)
        else:
            found["s3-etag"] = found["md5"]
    return found
