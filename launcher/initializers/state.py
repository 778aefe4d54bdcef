"""The state directory (STATE_DIR) inside the target, and how its files are opened.

The target may sit on a volume that other pods write too, so what is found under STATE_DIR is
not trusted: state files are opened with O_NOFOLLOW, a link or hard link found at a state file's
name is unlinked and the file made afresh (``ours``), a link where STATE_DIR or its parts
directory belongs is replaced by a directory (``own_state_directory``), and a final name is only
ever reached by renaming a part the engine created, which replaces whatever was there. Nothing is
written, or read, outside the target through the state directory.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from collections.abc import Callable

STATE_DIR = ".trainer-launcher"


# How every state file under STATE_DIR is opened: never through a symlink at its name (another
# pod writing the same volume may have planted one), never blocking on a FIFO planted there.
NO_LINK = os.O_NOFOLLOW | os.O_CLOEXEC
_NO_LINK_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def write_json(path: str, data: dict, durable: bool = True) -> None:
    """``data`` at ``path``, whole or not at all: written to a temporary beside it, renamed over it
    (which replaces, never follows, whatever was at ``path``)."""
    temporary = f"{path}.tmp{threading.get_ident()}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | NO_LINK
    try:
        fd = os.open(temporary, flags, 0o666)
    except FileExistsError:  # left by a crash, or planted: the name is ours, what it points at is not
        os.unlink(temporary)
        fd = os.open(temporary, flags, 0o666)
    with os.fdopen(fd, "w") as handle:
        # One line, by the C encoder: a manifest of 10,000 files in 0.03 s (indented: Python's, 0.1 s).
        handle.write(json.dumps(data, sort_keys=True, separators=(",", ":")))
        if durable:
            handle.flush()
            os.fsync(handle.fileno())
    os.replace(temporary, path)


def read_state(path: str) -> bytes | None:
    """A state file's bytes; None when it is missing or is no regular file (a symlink, a FIFO or
    a directory at its name is never followed: what it holds was not written by us)."""
    try:
        fd = os.open(path, _NO_LINK_READ)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(fd, "rb", closefd=False) as handle:
            return handle.read()
    except OSError:
        return None
    finally:
        os.close(fd)


_PART_MODES = {
    "rb": os.O_RDONLY,
    "wb": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
    "ab": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
}


def open_part(path: str, mode: str):
    """``open(path, mode)`` for a partial file, never through a symlink at its name: the one that
    was there when the run began is gone already (``ours``), so one found now is refused (ELOOP)."""
    return os.fdopen(os.open(path, _PART_MODES[mode] | NO_LINK, 0o666), mode)


def read_json(path: str) -> dict:
    try:
        data = json.loads(read_state(path) or b"{}")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def ours(path: str, log: Callable[[str], None]) -> bool:
    """Whether a state file of ours is at ``path``: a regular file with this one name. Anything
    else there (a symlink, a hard link to a file elsewhere on the volume, a FIFO) was put there by
    another writer of the volume: writing through it would write outside the target, so its name is
    unlinked (the name is ours to reuse; what it pointed at is left alone) and False returned, as
    when there was nothing. One lstat: callers ask only where a leftover is expected."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISREG(info.st_mode) and info.st_nlink == 1:
        return True
    log(f"{path}: not a file the initializer wrote (a link or a special file); removed, its target left alone")
    os.unlink(path)
    return False


def own_state_directory(target: str, log: Callable[[str], None]) -> str:
    """``target/STATE_DIR`` as a real directory, made if missing; its path.

    A symlink there is replaced, not followed and not refused: the initializer never makes one,
    so it was planted by another writer of a shared volume, and following it would write our state
    (parts, manifest, lease) wherever it points. Replacing loses nothing that matters: everything
    under STATE_DIR only records progress, and what it would have recorded is fetched again.
    Refusing would fail the job permanently over a volume that the initializer can repair."""
    state = os.path.join(target, STATE_DIR)
    own_directory(state, log)
    return state


def own_directory(path: str, log: Callable[[str], None]) -> None:
    """``path`` as a real directory; a symlink there is replaced (see own_state_directory)."""
    try:
        os.mkdir(path)
        return
    except FileExistsError:
        pass
    if os.path.islink(path):
        log(
            f"{path}: a symbolic link where the initializer keeps its state; replaced by a directory "
            f"(its target left alone)"
        )
        os.unlink(path)
        os.mkdir(path)
    # A file there is no directory: the first write under it fails with ENOTDIR, a permanent BadPath.
