"""What a listing is (``RemoteFile``, ``Source``), and the checks it passes before a byte is written.

A listing is planned before a byte is written: unsafe paths and two files meeting on one path
(``refuse_clashes``) are refused.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from launcher.core.outcome import Reasons
from launcher.initializers.errors import PermanentError
from launcher.initializers.state import STATE_DIR


@dataclass(frozen=True)
class RemoteFile:
    path: str  # relative, '/'-separated: where it lands under the target
    size: int | None
    checksum: tuple[str, str] | None = None  # ("md5" | "sha256" | "git-sha1" | "s3-multipart:<part size>", hex)
    version: str = ""  # ETag, commit or mtime: changes when the source changes
    key: str = ""  # the source's own name for it (object key, repo path, URL)


# A piece of a file's bytes: bytes, or a view of a buffer that the source refills for the next piece
# (used before the next one is asked for: launcher.initializers.http.get_range).
Chunk = bytes | memoryview


class Source(Protocol):
    supports_range: bool

    def list(self) -> list[RemoteFile]: ...

    def read(self, file: RemoteFile, start: int, chunk_size: int, end: int | None = None) -> Iterator[Chunk]:
        """Bytes [start, end) of the file (to its end when ``end`` is None), in chunks."""

    # Optional: ``local_path(file) -> str | None``, a path this machine can open for the file's
    # bytes; the engine then copies it with the kernel instead of calling read().


def select(files: list[RemoteFile], allow: tuple[str, ...] | None, ignore: tuple[str, ...] | None) -> list[RemoteFile]:
    def matches(path: str, globs: tuple[str, ...]) -> bool:
        name = path.rsplit("/", 1)[-1]
        return any(fnmatch.fnmatchcase(path, g) or fnmatch.fnmatchcase(name, g) for g in globs)

    return [f for f in files if (not allow or matches(f.path, allow)) and not (ignore and matches(f.path, ignore))]


def safe_destination(target: str, relative: str, _checked: dict[str, str] | None = None) -> str:
    """``target/relative``, refusing anything that would land outside ``target`` or in its state
    directory (also through a link already in the target). ``_checked`` remembers directories
    already resolved (realpath costs a syscall per path component)."""
    if not relative or relative.startswith("/") or "\\" in relative or "\x00" in relative:
        raise PermanentError(f"refusing the unsafe path {relative!r}", Reasons.UNSAFE_PATH)
    parts = relative.split("/")
    if any(p in ("", ".", "..") for p in parts) or parts[0] == STATE_DIR:
        raise PermanentError(f"refusing the unsafe path {relative!r}", Reasons.UNSAFE_PATH)
    destination = os.path.join(target, *parts)
    directory = os.path.dirname(destination)
    if _checked is not None and directory in _checked:
        return destination
    root = _checked.get("") if _checked else None
    if root is None:
        root = os.path.realpath(target)
    if why := outside_the_data(root, os.path.realpath(directory)):
        raise PermanentError(f"refusing {relative!r}: {why}", Reasons.UNSAFE_PATH)
    if _checked is not None:
        _checked[""] = root
        _checked[directory] = root
    return destination


def outside_the_data(root: str, resolved: str) -> str | None:
    """Why the real path ``resolved`` is no place for data under the target's real path ``root``
    (outside it, or in its state directory, which only the initializer writes); None if it is."""
    if os.path.commonpath([root, resolved]) != root:
        return "it resolves outside the target"
    state = os.path.join(root, STATE_DIR)
    if os.path.commonpath([state, resolved]) == state:
        return f"it resolves into the initializer's own {STATE_DIR} directory"
    return None


def refuse_clashes(files: list[RemoteFile]) -> None:
    """Refuse a listing in which two files land on one path, or one file's path is another's
    directory (``data/x`` and ``data/x/x`` under ``s3://b/data/x``; ``a`` and ``a/b``). Pure, so
    it runs before any byte is written: fetched, two such files would share one partial file or
    fail on the rename, and every retry would meet the same listing. Paths are already canonical
    (``safe_destination`` refuses empty, ``.`` and ``..`` parts), so equal strings are the only
    way two paths meet."""
    by_path: dict[str, RemoteFile] = {}
    for file in files:
        if (first := by_path.setdefault(file.path, file)) is not file:
            raise PermanentError(
                f"the listing has {_named(first)} and {_named(file)}, which both land on {file.path!r}",
                Reasons.PATH_CLASH,
            )
    directories: set[str] = set()
    for file in files:
        directory = file.path
        while "/" in directory:
            directory = directory.rsplit("/", 1)[0]
            if directory in directories:
                break  # this directory and the ones above it are checked already
            directories.add(directory)
            if (blocking := by_path.get(directory)) is not None:
                raise PermanentError(
                    f"the listing has {_named(blocking)}, which lands on {directory!r}, and "
                    f"{_named(file)}, which needs {directory!r} as a directory",
                    Reasons.PATH_CLASH,
                )


def _named(file: RemoteFile) -> str:
    """A file as its source names it (the object key, the repo path), else where it lands."""
    return repr(file.key or file.path)
