"""The storage errors: what may heal on another try, and what no retry fixes."""

from __future__ import annotations

import errno
import re

from launcher.core.outcome import LauncherError, Outcome, Reason, Reasons


# Storage errors are launcher errors: each names its reason, which gives its exit code (138 for
# what may heal on another try, 2 for what no retry fixes), so init maps them by type.
class TransientError(LauncherError):
    """Worth retrying: connection errors, timeouts, 429, 5xx, a checksum mismatch."""

    reason = Reasons.STORAGE_UNAVAILABLE


class CorruptDataError(TransientError):
    """The transport itself saw bad bytes (a checksum of its own failed): discard the partial file."""


class PermanentError(LauncherError):
    """Not worth retrying: 401/403/404, hostile paths, a file that stays wrong."""

    def __init__(self, message: str, reason: Reason = Reasons.STORAGE_ERROR):
        super().__init__(message)
        self.reason = reason


# The server's TLS certificate refused: OpenSSL's words (Python's ssl, boto3) or rustls' (obstore).
_REFUSED_CERTIFICATE = re.compile(r"certificate verify failed: ([^(]+?)\s*(?:\(|$)|InvalidCertificate\(\s*(\w+)")


def refused_certificate(error: BaseException, what: str, trust: str) -> PermanentError | None:
    """The server's certificate was refused (no trusted CA signed it, it is for another host, it
    expired): another try meets the same certificate. ``trust``: the variable that names the CA
    bundle to trust. None for any other error."""
    found = _REFUSED_CERTIFICATE.search(str(error))
    if found is None:
        return None
    why = (found.group(1) or found.group(2)).rstrip(".")
    return PermanentError(
        f"{what}: the server's TLS certificate was refused ({why}); {trust} names the CA bundle to trust",
        Reasons.CONFIG_ERROR,
    )


# Local file-system errors that a retry of the same pod spec meets again: the volume's
# permissions, a read-only or full volume (quota included), a path that cannot be a directory.
# Every other errno (EIO, ESTALE, ETIMEDOUT, ENOMEM, EMFILE, ...) may heal on another try.
PERMANENT_ERRNOS: dict[int, Reason] = {
    errno.EACCES: Reasons.PERMISSION_DENIED,
    errno.EPERM: Reasons.PERMISSION_DENIED,
    errno.EROFS: Reasons.READ_ONLY_FILE_SYSTEM,
    errno.ENOSPC: Reasons.NO_SPACE,
    errno.EDQUOT: Reasons.NO_SPACE,
    errno.EFBIG: Reasons.NO_SPACE,
    errno.ENOTDIR: Reasons.BAD_PATH,
    errno.EISDIR: Reasons.BAD_PATH,
    errno.EEXIST: Reasons.BAD_PATH,
    errno.ENAMETOOLONG: Reasons.BAD_PATH,
    errno.ELOOP: Reasons.BAD_PATH,
}


def permanent_os_error(error: OSError) -> Reason | None:
    """The reason an OSError will not heal on retry, or None when it may."""
    return PERMANENT_ERRNOS.get(error.errno) if error.errno is not None else None


class LocalIOError(LauncherError):
    """The target's file system failed us: permanent where no retry fixes it (PERMANENT_ERRNOS)."""

    def __init__(self, error: OSError, target: str):
        where = error.filename if isinstance(error.filename, str) else target
        super().__init__(f"{where}: {error.strerror or error}")
        self.reason = permanent_os_error(error) or Reasons.LOCAL_IO_ERROR


def local_source_error(path: str, error: OSError) -> Exception:
    """A source file on this machine that could not be read: gone is NotFound, what no retry
    fixes is permanent, the rest transient."""
    if isinstance(error, FileNotFoundError):
        return PermanentError(f"{path} disappeared", Reasons.NOT_FOUND)
    if error.errno == errno.ELOOP:
        return PermanentError(f"{path} became a symbolic link after it was listed", Reasons.UNSAFE_PATH)
    if reason := permanent_os_error(error):
        return PermanentError(f"{path}: {error.strerror}", reason)
    return TransientError(f"{path}: {error.strerror}")


def failure_outcome(error: LauncherError | OSError, shown: str, target: str) -> Outcome:
    """The row of the table of reasons for a failed initialization of ``target`` from ``shown`` (the
    storage URI, credentials out): what no retry fixes (a permanent storage error, a target the pod
    may not write or that is full) exits 2, the rest 138. Retryable follows from the code, at delivery."""
    if isinstance(error, OSError):
        return LocalIOError(error, target).outcome().with_extra(uri=shown)
    if isinstance(error, LocalIOError):
        return error.outcome().with_extra(uri=shown)
    return error.outcome(f"{shown}: {error}").with_extra(uri=shown)
