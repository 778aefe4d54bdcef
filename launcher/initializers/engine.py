"""One transfer engine for every scheme: parallel, atomic, resumable, verified, with progress.

On disk, inside the target directory:
- ``<path>``: a file appears under its final name only complete and verified (written to
  ``.trainer-launcher/parts/<id>.part``, fsynced, then renamed into place);
- ``.trainer-launcher/manifest.json``: what is complete (size, checksum, source version), plus
  ``manifest.journal``, one line appended per file as it completes (folded into the manifest at
  the end, so the cost per file stays constant). A rerun skips complete files without touching
  the network for their bodies; a file whose entry, size or source version disagrees is fetched
  again;
- ``.trainer-launcher/parts/<id>.part`` (+ ``.json``): a partial download, resumed with a Range
  request if the source version is still the same, after re-hashing what is already there.
"""

from __future__ import annotations

import errno
import fnmatch
import hashlib
import json
import os
import random
import sys
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol

STATE_DIR = ".trainer-launcher"


class TransientError(Exception):
    """Worth retrying: connection errors, timeouts, 429, 5xx, a checksum mismatch."""


class CorruptDataError(TransientError):
    """The transport itself saw bad bytes (a checksum of its own failed): discard the partial file."""


class PermanentError(Exception):
    """Not worth retrying: 401/403/404, hostile paths, a file that stays wrong."""

    def __init__(self, message: str, reason: str = "StorageError"):
        super().__init__(message)
        self.reason = reason


# Local file-system errors that a retry of the same pod spec meets again: the volume's
# permissions, a read-only or full volume (quota included), a path that cannot be a directory.
# Every other errno (EIO, ESTALE, ETIMEDOUT, ENOMEM, EMFILE, ...) may heal on another try.
PERMANENT_ERRNOS: dict[int, str] = {
    errno.EACCES: "PermissionDenied",
    errno.EPERM: "PermissionDenied",
    errno.EROFS: "ReadOnlyFileSystem",
    errno.ENOSPC: "NoSpace",
    errno.EDQUOT: "NoSpace",
    errno.EFBIG: "NoSpace",
    errno.ENOTDIR: "BadPath",
    errno.EISDIR: "BadPath",
    errno.EEXIST: "BadPath",
    errno.ENAMETOOLONG: "BadPath",
    errno.ELOOP: "BadPath",
}


def permanent_os_error(error: OSError) -> str | None:
    """The reason an OSError will not heal on retry, or None when it may."""
    return PERMANENT_ERRNOS.get(error.errno)


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


def safe_destination(target: str, relative: str) -> str:
    """``target/relative``, refusing anything that would land outside ``target``."""
    if not relative or relative.startswith("/") or "\\" in relative or "\x00" in relative:
        raise PermanentError(f"refusing the unsafe path {relative!r}", "UnsafePath")
    parts = relative.split("/")
    if any(p in ("", ".", "..") for p in parts) or parts[0] == STATE_DIR:
        raise PermanentError(f"refusing the unsafe path {relative!r}", "UnsafePath")
    destination = os.path.join(target, *parts)
    root = os.path.realpath(target)
    if os.path.commonpath([root, os.path.realpath(os.path.dirname(destination))]) != root:
        raise PermanentError(f"refusing {relative!r}: it resolves outside the target", "UnsafePath")
    return destination


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


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_json(path: str, data: dict) -> None:
    temporary = f"{path}.tmp{threading.get_ident()}"
    with open(temporary, "w") as handle:
        json.dump(data, handle, indent=1, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def _read_json(path: str) -> dict:
    try:
        with open(path) as handle:
            data = json.load(handle)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


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
        self._lock = threading.Lock()
        self._journal = None
        self._directories: set[str] = set()

    def run(self, files: list[RemoteFile]) -> Summary:
        started = time.monotonic()
        os.makedirs(self.parts, exist_ok=True)
        destinations = {f.path: safe_destination(self.target, f.path) for f in files}  # refuse before writing
        manifest = self._load_manifest()
        self._manifest = dict(manifest)
        summary = Summary(files=len(files))
        todo = []
        for file in files:
            entry = manifest.get(file.path)
            destination = destinations[file.path]
            if (entry and entry.get("version") == file.version and entry.get("size") == file.size
                    and os.path.isfile(destination) and os.path.getsize(destination) == file.size):
                summary.skipped += 1
            else:
                todo.append(file)
        total = sum(f.size or 0 for f in todo)
        self._journal = open(self.journal_path, "a")
        try:
            summary = self._run(todo, destinations, summary, total)
        finally:
            self._journal.close()
            self._fold_manifest()
        summary.seconds = time.monotonic() - started
        summary.paths = sorted(f.path for f in files)
        return summary

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
        try:
            with open(self.journal_path) as journal:
                for line in journal:
                    try:
                        entry = json.loads(line)
                        files[entry.pop("path")] = entry
                    except (ValueError, KeyError, AttributeError):
                        continue
        except OSError:
            pass
        return files

    def _fold_manifest(self) -> None:
        """Make the renames durable (one fsync per directory), then fold the journal in."""
        for directory in self._directories:
            _fsync_dir(directory)
        _write_json(self.manifest_path, {"files": self._manifest})
        os.unlink(self.journal_path)

    def _fetch_with_retries(self, file: RemoteFile, destination: str, progress: Progress) -> int:
        attempt = 0
        while True:
            try:
                return self._fetch(file, destination, progress)
            except TransientError as error:
                attempt += 1
                if attempt > self.retries:
                    raise TransientError(f"{file.path}: {error} (after {attempt} attempts)") from None
                delay = min(30.0, 0.2 * 2 ** (attempt - 1)) * random.uniform(0.5, 1.5)
                self.log(f"{file.path}: {error}; retrying in {delay:.1f}s ({attempt}/{self.retries})")
                self.sleep(delay)

    def _fetch(self, file: RemoteFile, destination: str, progress: Progress) -> int:
        ident = hashlib.sha256(file.path.encode()).hexdigest()[:32]
        part = os.path.join(self.parts, f"{ident}.part")
        meta_path = f"{part}.json"
        meta = _read_json(meta_path)
        same_source = (os.path.exists(part) and meta.get("version") == file.version
                       and meta.get("path") == file.path and self.source.supports_range)
        if file.size is not None and file.size >= self.ranged_min and self.source.supports_range:
            resumed = self._fetch_ranges(file, part, meta_path, meta if same_source else {}, progress)
            checksum = _Checksum(file.checksum[0] if file.checksum else None, file.size)
            start = 0
            with open(part, "rb") as written:  # ranges arrive out of order: hash in one pass
                while block := written.read(1 << 20):
                    checksum.update(block)
                    start += len(block)
        else:
            start, checksum, resumed = self._fetch_stream(file, part, meta_path, same_source, progress)
        if file.size is not None and start != file.size:
            if start > file.size:
                os.unlink(part)
            raise TransientError(f"got {start} of {file.size} bytes")
        return self._commit(file, part, meta_path, checksum, start, destination, progress, resumed)

    def _fetch_stream(self, file: RemoteFile, part: str, meta_path: str, same_source: bool, progress: Progress):
        """One sequential stream, resumed from the end of a partial file of the same version."""
        start = 0
        checksum = _Checksum(file.checksum[0] if file.checksum else None, file.size)
        if same_source:
            with open(part, "rb") as existing:  # re-hash what is there: it must still verify
                while block := existing.read(1 << 20):
                    checksum.update(block)
                    start += len(block)
            if file.size is not None and start > file.size:
                start, checksum = 0, _Checksum(file.checksum[0] if file.checksum else None, file.size)
        elif file.size is None or file.size > self.chunk_size:  # worth resuming: remember the version
            _write_json(meta_path, {"path": file.path, "version": file.version})
        resumed = start
        complete = file.size is not None and start >= file.size  # all there: only verify
        with open(part, "ab" if start else "wb") as out:
            try:
                for chunk in () if complete else self.source.read(file, start, self.chunk_size):
                    out.write(chunk)
                    checksum.update(chunk)
                    start += len(chunk)
                    progress.add(len(chunk))
            except CorruptDataError:
                os.unlink(part)
                raise
            finally:
                out.flush()
                os.fsync(out.fileno())
        return start, checksum, resumed

    def _fetch_ranges(self, file: RemoteFile, part: str, meta_path: str, meta: dict, progress: Progress) -> int:
        """Parallel byte ranges written in place; finished ranges are recorded, so a rerun after a
        crash fetches only the ranges that were not complete."""
        size = file.size
        segment = max(self.chunk_size, -(-size // self.concurrency))
        done = set(meta.get("segments", [])) if meta.get("segment") == segment else set()
        resumed = sum(min(segment, size - offset) for offset in done)
        if not done:
            with open(part, "wb") as out:
                out.truncate(size)
        record = {"path": file.path, "version": file.version, "segment": segment, "segments": sorted(done)}
        _write_json(meta_path, record)
        lock = threading.Lock()
        fd = os.open(part, os.O_WRONLY)

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
            os.fsync(fd)
        except CorruptDataError:
            os.unlink(part)
            raise
        finally:
            os.close(fd)
        return resumed

    def _commit(self, file: RemoteFile, part: str, meta_path: str, checksum: _Checksum, start: int,
                destination: str, progress: Progress, resumed: int) -> int:
        digest = checksum.hexdigest()
        if file.checksum and digest != file.checksum[1]:
            os.unlink(part)
            raise TransientError(f"{file.checksum[0]} mismatch: expected {file.checksum[1]}, got {digest}")
        directory = os.path.dirname(destination)
        if directory not in self._directories:
            os.makedirs(directory, exist_ok=True)
        os.replace(part, destination)
        try:
            os.unlink(meta_path)
        except FileNotFoundError:
            pass
        entry = {"size": start, "version": file.version,
                 "checksum": f"{file.checksum[0]}:{file.checksum[1]}" if file.checksum else None}
        with self._lock:
            self._directories.add(directory)
            self._manifest[file.path] = entry
            self._journal.write(json.dumps({"path": file.path, **entry}) + "\n")
            self._journal.flush()
        progress.add(files=1)
        return resumed
