"""One transfer engine for every scheme: parallel, atomic, resumable, verified, with progress.

On disk, inside the target directory:
- ``<path>``: a file appears under its final name only complete and verified (written to
  ``.trainer-launcher/parts/<id>.part``, made durable, then renamed into place);
- ``.trainer-launcher/manifest.json``: what is complete (size, checksum, source version), plus
  ``manifest.journal``, one line appended per file as it completes (folded into the manifest at
  the end, so the cost per file stays constant). A rerun skips complete files without touching
  the network for their bodies; a file whose entry, size or source version disagrees is fetched
  again;
- ``.trainer-launcher/parts/<id>.part`` (+ ``.json``): a partial download, resumed with a Range
  request if the source version is still the same, after re-hashing what is already there.

Durability, batched (see ``_Committer``): instead of an fsync per file, one ``syncfs`` of the
target's file system per batch. A verified part is renamed into place only after a sync that
followed its last write, and its journal line is written only after a sync that followed its
rename, so a node crash leaves at worst parts, or files under their final names that the
manifest does not list: both are fetched again, and nothing partial ever sits under a final name.

Local sources (file://, a mounted volume) are copied by the kernel (``_copy_local``): Python
never touches the bytes.

The target may sit on a volume that other pods write too, so what is found under STATE_DIR is
not trusted: state files are opened with O_NOFOLLOW, a link or hard link found at a state file's
name is unlinked and the file made afresh (``_ours``), a link where STATE_DIR or its parts
directory belongs is replaced by a directory (``own_state_directory``), and a final name is only
ever reached by renaming a part the engine created, which replaces whatever was there. Nothing is
written, or read, outside the target through the state directory. A listing is planned before a
byte is written: unsafe paths and two files meeting on one path (``refuse_clashes``) are refused.
"""

from __future__ import annotations

import errno
import fnmatch
import hashlib
import json
import os
import random
import stat
import sys
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol

from launcher.core.outcome import LauncherError, Reason, Reasons

STATE_DIR = ".trainer-launcher"


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
    return PERMANENT_ERRNOS.get(error.errno)


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


@dataclass(frozen=True)
class RemoteFile:
    path: str  # relative, '/'-separated: where it lands under the target
    size: int | None
    checksum: tuple[str, str] | None = None  # ("md5" | "sha256" | "git-sha1" | "s3-multipart:<part size>", hex)
    version: str = ""  # ETag, commit or mtime: changes when the source changes
    key: str = ""  # the source's own name for it (object key, repo path, URL)


class Source(Protocol):
    supports_range: bool

    def list(self) -> list[RemoteFile]: ...

    def read(self, file: RemoteFile, start: int, chunk_size: int, end: int | None = None) -> Iterator[bytes]:
        """Bytes [start, end) of the file (to its end when ``end`` is None), in chunks."""

    # Optional: ``local_path(file) -> str | None``, a path this machine can open for the file's
    # bytes; the engine then copies it with the kernel instead of calling read().


@dataclass
class Summary:
    files: int = 0
    skipped: int = 0
    fetched: int = 0
    bytes_fetched: int = 0
    resumed_bytes: int = 0
    seconds: float = 0.0
    paths: list[str] = field(default_factory=list)


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
            raise PermanentError(f"the listing has {_named(first)} and {_named(file)}, which both land on "
                                 f"{file.path!r}", Reasons.PATH_CLASH)
    directories: set[str] = set()
    for file in files:
        directory = file.path
        while "/" in directory:
            directory = directory.rsplit("/", 1)[0]
            if directory in directories:
                break  # this directory and the ones above it are checked already
            directories.add(directory)
            if (blocking := by_path.get(directory)) is not None:
                raise PermanentError(f"the listing has {_named(blocking)}, which lands on {directory!r}, and "
                                     f"{_named(file)}, which needs {directory!r} as a directory", Reasons.PATH_CLASH)


def _named(file: RemoteFile) -> str:
    """A file as its source names it (the object key, the repo path), else where it lands."""
    return repr(file.key or file.path)


class _Checksum:
    """md5, sha256, git's blob sha1, or S3's multipart ETag (md5 of the parts' md5s, "-N")."""

    def __init__(self, kind: str | None, size: int | None):
        self.kind = kind
        self._part_size = int(kind.split(":")[1]) if kind and kind.startswith("s3-multipart:") else 0
        if self._part_size:
            self._hash, self._part, self._filled, self._digests = None, hashlib.md5(), 0, []
        elif kind == "git-sha1":
            self._hash = hashlib.sha1(f"blob {size}\0".encode())
        elif kind in ("md5", "sha256"):
            self._hash = hashlib.new(kind)
        else:
            self._hash = None

    def update(self, data: bytes) -> None:
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

    def hexdigest(self) -> str | None:
        if self._part_size:
            digests = self._digests + ([self._part.digest()] if self._filled else [])
            return f"{hashlib.md5(b''.join(digests)).hexdigest()}-{len(digests)}"
        return self._hash.hexdigest() if self._hash is not None else None


# How every state file under STATE_DIR is opened: never through a symlink at its name (another
# pod writing the same volume may have planted one), never blocking on a FIFO planted there.
_NO_LINK = os.O_NOFOLLOW | os.O_CLOEXEC
_NO_LINK_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _write_json(path: str, data: dict, durable: bool = True) -> None:
    """``data`` at ``path``, whole or not at all: written to a temporary beside it, renamed over it
    (which replaces, never follows, whatever was at ``path``)."""
    temporary = f"{path}.tmp{threading.get_ident()}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NO_LINK
    try:
        fd = os.open(temporary, flags, 0o666)
    except FileExistsError:  # left by a crash, or planted: the name is ours, what it points at is not
        os.unlink(temporary)
        fd = os.open(temporary, flags, 0o666)
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle, indent=1, sort_keys=True)
        if durable:
            handle.flush()
            os.fsync(handle.fileno())
    os.replace(temporary, path)


def _read_state(path: str) -> bytes | None:
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


_PART_MODES = {"rb": os.O_RDONLY, "wb": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
               "ab": os.O_WRONLY | os.O_CREAT | os.O_APPEND}


def _open_part(path: str, mode: str):
    """``open(path, mode)`` for a partial file, never through a symlink at its name: the one that
    was there when the run began is gone already (``_ours``), so one found now is refused (ELOOP)."""
    return os.fdopen(os.open(path, _PART_MODES[mode] | _NO_LINK, 0o666), mode)


def _read_json(path: str) -> dict:
    try:
        data = json.loads(_read_state(path) or b"{}")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _ours(path: str, log: Callable[[str], None]) -> bool:
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
    _own_directory(state, log)
    return state


def _own_directory(path: str, log: Callable[[str], None]) -> None:
    """``path`` as a real directory; a symlink there is replaced (see own_state_directory)."""
    try:
        os.mkdir(path)
        return
    except FileExistsError:
        pass
    if os.path.islink(path):
        log(f"{path}: a symbolic link where the initializer keeps its state; replaced by a directory "
            f"(its target left alone)")
        os.unlink(path)
        os.mkdir(path)
    # A file there is no directory: the first write under it fails with ENOTDIR, a permanent BadPath.


def _syncfs(fd: int) -> None:
    """Flush every dirty page and metadata change of the file system holding ``fd`` (one call
    for a whole batch of files), or of every file system where syncfs(2) is missing."""
    import ctypes  # only here: most commands never sync

    syncfs = getattr(ctypes.CDLL(None, use_errno=True), "syncfs", None)
    if syncfs is not None:
        if syncfs(fd) == 0:
            return
        code = ctypes.get_errno()
        if code not in (errno.ENOSYS, errno.EINVAL):
            raise OSError(code, f"syncfs: {os.strerror(code)}")
    os.sync()


@dataclass
class _Done:
    """A verified part waiting to become durable, then renamed, then journaled."""
    part: str
    destination: str
    meta: str | None  # its resume record, removed once the file is in place
    path: str
    entry: dict


class _Committer:
    """Durability in batches, on a thread of its own, so workers never wait on the disk.

    Each round: one syncfs of the target's file system; then the journal lines of the files
    renamed in the previous round (their renames are now durable), then the renames of the parts
    queued before this sync (their bytes are now durable). Measured here on 500 x 64 KiB files,
    an fsync per file, os.sync, fdatasync in 8 threads and syncfs cost about the same disk time
    (0.07-0.13 s, noisy), so the gain is the workers' syscalls and waits; syncfs was the cheapest
    and, unlike os.sync, does not flush the node's other volumes. A round starts every
    ``batch_bytes`` too, so the disk writes back while the workers still copy: on 265 MB of
    file://, 32 MiB rounds took the run from 0.84 s to 0.72 s (256 MiB: one sync at the end).
    """

    def __init__(self, target: str, journal, manifest: dict, interval: float = 0.5, batch_bytes: int = 32 << 20):
        self._fd = os.open(target, os.O_RDONLY)
        self._journal, self._manifest = journal, manifest
        self._interval, self._batch_bytes = interval, batch_bytes
        self._cond = threading.Condition()
        self._written: list[_Done] = []
        self._written_bytes = 0
        self._renamed: list[_Done] = []
        self._closing = False
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def add(self, done: _Done, size: int) -> None:
        with self._cond:
            if self.error is not None:
                raise self.error
            self._written.append(done)
            self._written_bytes += size
            if self._written_bytes >= self._batch_bytes:
                self._cond.notify()

    def close(self) -> None:
        """Commit everything queued (also when the run failed: finished files are kept)."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join()
        os.close(self._fd)
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    self._cond.wait_for(lambda: self._closing or self._written_bytes >= self._batch_bytes,
                                        self._interval)
                    written, self._written, self._written_bytes = self._written, [], 0
                    closing = self._closing
                if written or self._renamed:
                    _syncfs(self._fd)
                    self._record(self._renamed)
                    self._renamed = self._rename(written)
                if closing:
                    if self._renamed:
                        _syncfs(self._fd)
                        self._record(self._renamed)
                    return
        except BaseException as error:  # noqa: BLE001 - handed to the workers and to close()
            with self._cond:
                self.error = error

    def _rename(self, batch: list[_Done]) -> list[_Done]:
        # Each part is a regular file the engine created without following links (_ours,
        # _open_part), so what lands under a final name is never a link. No lstat here: a writer
        # fast enough to swap a part for a link in between could swap the final file just after.
        for done in batch:
            os.replace(done.part, done.destination)
            if done.meta:
                try:
                    os.unlink(done.meta)
                except FileNotFoundError:
                    pass
        return batch

    def _record(self, batch: list[_Done]) -> None:
        if not batch:
            return
        self._journal.write("".join(json.dumps({"path": d.path, **d.entry}) + "\n" for d in batch))
        self._journal.flush()
        for done in batch:
            self._manifest[done.path] = done.entry


# The kernel declines to copy between these two files this way: try the next way.
_NO_KERNEL_COPY = {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL, errno.ETXTBSY,
                   errno.EBADF}


def _identity(info: os.stat_result) -> tuple:
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def _regular_size(path: str) -> int | None:
    """The size of the regular file at ``path`` (a symlink there is not one: it is fetched again,
    and the rename replaces it)."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return info.st_size if stat.S_ISREG(info.st_mode) else None


class Progress:
    """A log line every ``interval`` seconds: files, bytes, rate, ETA."""

    def __init__(self, total_files: int, total_bytes: int, log: Callable[[str], None], interval: float = 5.0):
        self.total_files, self.total_bytes, self.log, self.interval = total_files, total_bytes, log, interval
        self.tty = sys.stderr.isatty()  # on a terminal: one line redrawn in place, twice a second
        if self.tty:
            self.interval = 0.5
        self.files = 0
        self.bytes = 0
        self._lock = threading.Lock()
        self._start = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Progress:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        if self.tty:
            sys.stderr.write(f"\r{self.line()}\n")

    def add(self, nbytes: int = 0, files: int = 0) -> None:
        with self._lock:
            self.bytes += nbytes
            self.files += files

    def line(self) -> str:
        elapsed = max(time.monotonic() - self._start, 1e-6)
        rate = self.bytes / elapsed
        left = max(self.total_bytes - self.bytes, 0)
        eta = f", ETA {left / rate:.0f}s" if rate > 0 and self.total_bytes else ""
        return (f"{self.files}/{self.total_files} files, {self.bytes / 1e6:.1f}/{self.total_bytes / 1e6:.1f} MB, "
                f"{rate / 1e6:.1f} MB/s{eta}")

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            if self.tty:
                sys.stderr.write(f"\r{self.line()}\033[K")
                sys.stderr.flush()
            else:
                self.log(self.line())


class Engine:
    def __init__(self, source: Source, target: str, concurrency: int = 8, chunk_size: int = 8 << 20,
                 retries: int = 6, log: Callable[[str], None] = print, sleep: Callable[[float], None] = time.sleep,
                 ranged_min: int = 64 << 20):
        self.ranged_min = ranged_min  # files this big go as parallel byte ranges (if the source allows)
        self.source, self.target = source, target
        self.concurrency, self.chunk_size, self.retries = concurrency, chunk_size, retries
        self.log, self.sleep = log, sleep
        self.state = os.path.join(target, STATE_DIR)
        self.parts = os.path.join(self.state, "parts")
        self.manifest_path = os.path.join(self.state, "manifest.json")
        self.journal_path = os.path.join(self.state, "manifest.journal")
        self._committer: _Committer | None = None
        self._directories: set[str] = set()
        self._parts_found: set[str] = set()  # part files present when the run began
        self._copy_method: dict[tuple[int, int], int] = {}  # (source dev, target dev) -> first way that works

    def run(self, files: list[RemoteFile]) -> Summary:
        started = time.monotonic()
        destinations = self._plan(files)
        os.makedirs(self.target, exist_ok=True)
        own_state_directory(self.target, self.log)
        _own_directory(self.parts, self.log)
        manifest = self._load_manifest()
        self._manifest = dict(manifest)
        summary = Summary(files=len(files))
        todo = []
        for file in files:
            entry = manifest.get(file.path)
            if entry and entry.get("version") == file.version and entry.get("size") == file.size \
                    and _regular_size(destinations[file.path]) == file.size:
                summary.skipped += 1
            else:
                todo.append(file)
        total = sum(f.size or 0 for f in todo)
        self._parts_found = set(os.listdir(self.parts)) if todo else set()
        _ours(self.journal_path, self.log)  # its lines are read already; only ours is appended to
        journal = os.fdopen(os.open(self.journal_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | _NO_LINK, 0o666), "a")
        self._committer = _Committer(self.target, journal, self._manifest)
        try:
            try:
                summary = self._run(todo, destinations, summary, total)
            except BaseException:
                try:  # keep what finished; the first failure is the one to report
                    self._committer.close()
                except Exception:  # noqa: BLE001
                    pass
                raise
            self._committer.close()
        finally:
            journal.close()
            self._fold_manifest()
        summary.seconds = time.monotonic() - started
        summary.paths = sorted(f.path for f in files)
        return summary

    def _plan(self, files: list[RemoteFile]) -> dict[str, str]:
        """Where each file lands, refusing unsafe paths and clashing ones before a byte is written."""
        checked: dict[str, str] = {}
        destinations = {f.path: safe_destination(self.target, f.path, checked) for f in files}
        refuse_clashes(files)
        return destinations

    def _run(self, todo, destinations, summary: Summary, total: int) -> Summary:
        with Progress(len(todo), total, self.log) as progress, ThreadPoolExecutor(self.concurrency) as pool:
            futures = {pool.submit(self._fetch_with_retries, f, destinations[f.path], progress): f for f in todo}
            done, pending = wait(futures, return_when=FIRST_EXCEPTION)
            for future in pending:
                future.cancel()
            for future in done:
                future.result()  # the first failure, raised
            wait(pending)
            for future in futures:
                resumed = future.result()
                summary.resumed_bytes += resumed
        summary.fetched = len(todo)
        summary.bytes_fetched = progress.bytes
        return summary

    def _load_manifest(self) -> dict:
        """The manifest, with the journal of a run that did not finish folded in (a torn last
        line from a crash is ignored: that file is simply fetched again)."""
        files = _read_json(self.manifest_path).get("files", {})
        files = files if isinstance(files, dict) else {}
        for line in (_read_state(self.journal_path) or b"").splitlines():
            try:
                entry = json.loads(line)
                files[entry.pop("path")] = entry
            except (ValueError, KeyError, AttributeError, TypeError):
                continue
        return files

    def _fold_manifest(self) -> None:
        """Fold the journal in (the committer already made every listed file durable)."""
        _write_json(self.manifest_path, {"files": self._manifest})
        os.unlink(self.journal_path)

    def _fetch_with_retries(self, file: RemoteFile, destination: str, progress: Progress) -> int:
        attempt = 0
        while True:
            try:
                return self._fetch(file, destination, progress, attempt)
            except TransientError as error:
                attempt += 1
                if attempt > self.retries:
                    raise TransientError(f"{file.path}: {error} (after {attempt} attempts)") from None
                delay = min(30.0, 0.2 * 2 ** (attempt - 1)) * random.uniform(0.5, 1.5)
                self.log(f"{file.path}: {error}; retrying in {delay:.1f}s ({attempt}/{self.retries})")
                self.sleep(delay)

    def _fetch(self, file: RemoteFile, destination: str, progress: Progress, attempt: int = 0) -> int:
        ident = hashlib.sha256(file.path.encode()).hexdigest()[:32]
        part = os.path.join(self.parts, f"{ident}.part")
        meta_path = f"{part}.json"
        # A small file on a first attempt with no part left by an earlier run: no syscall to ask.
        has_part = bool(attempt or f"{ident}.part" in self._parts_found) and _ours(part, self.log)
        meta = _read_json(meta_path) if has_part else {}
        same_source = (has_part and meta.get("version") == file.version
                       and meta.get("path") == file.path and self.source.supports_range)
        local_path = getattr(self.source, "local_path", None)
        local = local_path(file) if local_path is not None else None
        if local is not None:
            start, resumed, has_meta = self._copy_local(file, local, part, meta_path, meta if same_source else {},
                                                        progress)
            return self._commit(file, part, meta_path if has_meta or meta else None,
                                _Checksum(None, file.size), start, destination, progress, resumed)
        if file.size is not None and file.size >= self.ranged_min and self.source.supports_range:
            resumed = self._fetch_ranges(file, part, meta_path, meta if same_source else {}, progress)
            checksum = _Checksum(file.checksum[0] if file.checksum else None, file.size)
            start = 0
            with _open_part(part, "rb") as written:  # ranges arrive out of order: hash in one pass
                while block := written.read(1 << 20):
                    checksum.update(block)
                    start += len(block)
        else:
            start, checksum, resumed = self._fetch_stream(file, part, meta_path, same_source, progress)
        if file.size is not None and start != file.size:
            if start > file.size:
                os.unlink(part)
            raise TransientError(f"got {start} of {file.size} bytes")
        ranged = file.size is not None and file.size >= self.ranged_min and self.source.supports_range
        wrote_meta = ranged or file.size is None or file.size > self.chunk_size  # as the fetches decide
        return self._commit(file, part, meta_path if meta or wrote_meta else None, checksum, start,
                            destination, progress, resumed)

    def _fetch_stream(self, file: RemoteFile, part: str, meta_path: str, same_source: bool, progress: Progress):
        """One sequential stream, resumed from the end of a partial file of the same version."""
        start = 0
        checksum = _Checksum(file.checksum[0] if file.checksum else None, file.size)
        if same_source:
            with _open_part(part, "rb") as existing:  # re-hash what is there: it must still verify
                while block := existing.read(1 << 20):
                    checksum.update(block)
                    start += len(block)
            if file.size is not None and start > file.size:
                start, checksum = 0, _Checksum(file.checksum[0] if file.checksum else None, file.size)
        elif file.size is None or file.size > self.chunk_size:  # worth resuming: remember the version
            _write_json(meta_path, {"path": file.path, "version": file.version}, durable=False)
        resumed = start
        complete = file.size is not None and start >= file.size  # all there: only verify
        with _open_part(part, "ab" if start else "wb") as out:
            try:
                for chunk in () if complete else self.source.read(file, start, self.chunk_size):
                    out.write(chunk)
                    checksum.update(chunk)
                    start += len(chunk)
                    progress.add(len(chunk))
            except CorruptDataError:
                os.unlink(part)
                raise
        return start, checksum, resumed

    def _fetch_ranges(self, file: RemoteFile, part: str, meta_path: str, meta: dict, progress: Progress) -> int:
        """Parallel byte ranges written in place; finished ranges are recorded, so a rerun after a
        crash fetches only the ranges that were not complete."""
        size = file.size
        segment = max(self.chunk_size, -(-size // self.concurrency))
        done = set(meta.get("segments", [])) if meta.get("segment") == segment else set()
        resumed = sum(min(segment, size - offset) for offset in done)
        if not done:
            with _open_part(part, "wb") as out:
                out.truncate(size)
        record = {"path": file.path, "version": file.version, "segment": segment, "segments": sorted(done)}
        _write_json(meta_path, record)
        lock = threading.Lock()
        fd = os.open(part, os.O_WRONLY | _NO_LINK)

        def fetch(offset: int) -> None:
            position = offset
            for chunk in self.source.read(file, offset, self.chunk_size, min(offset + segment, size)):
                os.pwrite(fd, chunk, position)
                position += len(chunk)
                progress.add(len(chunk))
            if position != min(offset + segment, size):
                raise TransientError(f"range at {offset}: got {position - offset} bytes")
            with lock:
                done.add(offset)
                record["segments"] = sorted(done)
                _write_json(meta_path, record)

        try:
            todo = [o for o in range(0, size, segment) if o not in done]
            with ThreadPoolExecutor(min(self.concurrency, max(len(todo), 1))) as pool:
                for future in [pool.submit(fetch, offset) for offset in todo]:
                    future.result()
        except CorruptDataError:
            os.unlink(part)
            raise
        finally:
            os.close(fd)
        return resumed

    def _commit(self, file: RemoteFile, part: str, meta_path: str | None, checksum: _Checksum, start: int,
                destination: str, progress: Progress, resumed: int) -> int:
        """Verified: hand the part to the committer, which renames it once its bytes are durable."""
        digest = checksum.hexdigest()
        if file.checksum and digest != file.checksum[1]:
            os.unlink(part)
            raise TransientError(f"{file.checksum[0]} mismatch: expected {file.checksum[1]}, got {digest}")
        directory = os.path.dirname(destination)
        if directory not in self._directories:
            os.makedirs(directory, exist_ok=True)
            self._directories.add(directory)
        entry = {"size": start, "version": file.version,
                 "checksum": f"{file.checksum[0]}:{file.checksum[1]}" if file.checksum else None}
        self._committer.add(_Done(part, destination, meta_path, file.path, entry), start)
        progress.add(files=1)
        return resumed

    def _copy_local(self, file: RemoteFile, source_path: str, part: str, meta_path: str, meta: dict,
                    progress: Progress) -> tuple[int, int, bool]:
        """Copy a file this machine can open with the kernel: Python never touches the bytes.

        file:// has no published checksum, so the check is on the source instead: its identity
        (device, inode, size, mtime_ns, ctime_ns) is taken before the copy and again after it,
        from the open descriptor and from the path; the copy must have the size seen before. A
        source written, truncated or replaced meanwhile fails the check: the part is dropped and
        the copy is a TransientError, tried again from scratch. A part is resumed from its size
        only when its record names the same source identity. Limit: a write landing within the
        file system's timestamp granularity of the first stat and changing neither size nor
        inode is not seen (rsync's quick check has the same limit).

        Returns (bytes in the part, bytes resumed, whether a resume record exists)."""
        try:
            # The source lists links already resolved (FileSource): one here appeared since.
            source = os.open(source_path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError as error:
            raise local_source_error(source_path, error) from None
        try:
            before = _identity(os.fstat(source))
            size = before[2]
            if file.size is not None and size != file.size:
                raise TransientError(f"changed since it was listed ({size} bytes, listed {file.size})")
            start = 0
            if meta and meta.get("source") == list(before):
                start = os.lstat(part).st_size
                if start > size:
                    start = 0
            has_meta = bool(meta)
            if not start and size > self.chunk_size:  # worth resuming: remember which source it is
                _write_json(meta_path, {"path": file.path, "version": file.version, "source": list(before)},
                            durable=False)
                has_meta = True
            out = os.open(part, os.O_WRONLY | os.O_CREAT | (0 if start else os.O_TRUNC) | _NO_LINK, 0o666)
            try:
                end = self._kernel_copy(source, out, start, size, progress)
            finally:
                os.close(out)
            if end != size or _identity(os.fstat(source)) != before or _identity(os.lstat(source_path)) != before:
                os.unlink(part)
                raise TransientError(f"{source_path} changed while it was copied")
            return end, start, has_meta
        finally:
            os.close(source)

    def _kernel_copy(self, source: int, out: int, position: int, end: int, progress: Progress) -> int:
        """copy_file_range in chunks (progress moves; the file system may reflink or copy on the
        server side), else sendfile, else pread/pwrite: whichever the kernel accepts first for
        this pair of file systems is remembered."""
        devices = (os.fstat(source).st_dev, os.fstat(out).st_dev)
        method = self._copy_method.get(devices, 0 if hasattr(os, "copy_file_range") else 1)
        while position < end:
            count = min(self.chunk_size, end - position)
            try:
                if method == 0:
                    copied = os.copy_file_range(source, out, count, position, position)
                elif method == 1:
                    os.lseek(out, position, os.SEEK_SET)
                    copied = os.sendfile(out, source, position, count)
                else:
                    copied = os.pwrite(out, os.pread(source, count, position), position)
            except OSError as error:
                if method < 2 and error.errno in _NO_KERNEL_COPY:
                    method += 1
                    self._copy_method[devices] = method
                    continue
                raise
            if copied == 0:  # some file systems answer 0 instead of an error: try the next way
                if method == 2:
                    break  # the source is shorter than it was: the identity check tells
                method += 1
                continue
            position += copied
            progress.add(copied)
        return position
