"""What a file's bytes hash to, in the forms the destinations compare: md5 (S3's ETag of a single
PUT, and the file target's check of its copy), S3's multipart ETag (the md5 of the parts' md5s,
"-N"), sha256 (an LFS object on the Hub) and git's blob sha1 (a regular file on the Hub).

One read per file, whatever the forms asked: hashlib releases the GIL over large buffers, so the
export's threads hash on every core."""

from __future__ import annotations

from launcher.initializers.checksum import Checksum
from launcher.initializers.errors import local_source_error

_READ = 8 << 20


def digest(path: str, size: int, forms: tuple[str, ...], part_size: int = 0) -> dict[str, str]:
    """The file's hex digests by form ("md5", "s3-etag", "sha256", "git-sha1"). "s3-etag" is what
    S3 answers for an upload in parts of ``part_size`` (a single PUT's md5 below it)."""
    multipart = "s3-etag" in forms and size > part_size
    single = {"md5"} if "s3-etag" in forms and not multipart else set()  # a single PUT's ETag is the md5
    hashes: dict[str, Checksum] = {
        form: Checksum(form, size) for form in ("md5", "sha256", "git-sha1") if form in forms or form in single
    }
    if multipart:
        hashes["s3-etag"] = Checksum(f"s3-multipart:{part_size}", size)
    try:
        with open(path, "rb") as handle:
            while chunk := handle.read(_READ):
                for h in hashes.values():
                    h.update(chunk)
    except OSError as error:
        raise local_source_error(path, error) from None
    found: dict[str, str] = {}
    for form, h in hashes.items():
        if (hexdigest := h.hexdigest()) is None:  # every form above has a digest
            raise ValueError(f"{form}: not a checksum form")
        found[form] = hexdigest
    if "s3-etag" in forms and not multipart:
        found["s3-etag"] = found["md5"]
    return found
