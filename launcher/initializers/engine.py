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

Durability is batched (``commit``): a file appears under its final name only once its bytes are
durable, and is journaled only once its rename is.

Local sources (file://, a mounted volume) are copied by the kernel (``_copy_local``): Python
never touches the bytes.

Elsewhere: the storage errors (``errors``), what a listing is and the checks it passes before a
byte is written (``listing``), the state directory's files, which are not trusted (``state``),
and the progress log (``progress``).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import random
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from launcher.core.workers import on_lanes
from launcher.initializers.checksum import Checksum
from launcher.initializers.commit import Committer, Done, start_writeback
from launcher.initializers.errors import CorruptDataError, TransientError, local_source_error
from launcher.initializers.lanes import Lanes
from launcher.initializers.listing import RemoteFile, Source, refuse_clashes, safe_destination
from launcher.initializers.progress import Progress
from launcher.initializers.ranges import CHUNK as RANGE_CHUNK
from launcher.initializers.ranges import fetch_ranges
from launcher.initializers.state import (
    NO_LINK,
    STATE_DIR,
    open_part,
    ours,
    own_directory,
    own_state_directory,
    read_json,
    read_state,
    write_json,
)


@dataclass
class Summary:
    files: int = 0
    skipped: int = 0
    fetched: int = 0
    bytes_fetched: int = 0
    resumed_bytes: int = 0
    seconds: float = 0.0
    paths: list[str] = field(default_factory=list)


# The kernel declines to copy between these two files this way: try the next way.
_NO_KERNEL_COPY = {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL, errno.ETXTBSY, errno.EBADF}


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


class Engine:
    def __init__(
        self,
        source: Source,
        target: str,
        concurrency: int = 8,
        chunk_size: int = 8 << 20,
        retries: int = 6,
        log: Callable[[str], None] = print,
        sleep: Callable[[float], None] = time.sleep,
        ranged_min: int = 64 << 20,
    ):
        self.ranged_min = ranged_min  # files this big go as byte ranges, resumable by segment (if the source allows)
        self._lanes = Lanes(
            concurrency, lambda: 0, min(chunk_size, RANGE_CHUNK)
        )  # set by _run(), on the run's progress
        self.source, self.target = source, target
        self.concurrency, self.chunk_size, self.retries = concurrency, chunk_size, retries
        self.log, self.sleep = log, sleep
        self.state = os.path.join(target, STATE_DIR)
        self.parts = os.path.join(self.state, "parts")
        self.manifest_path = os.path.join(self.state, "manifest.json")
        self.journal_path = os.path.join(self.state, "manifest.journal")
        self._committer: Committer | None = None
        self._directories: set[str] = set()
        self._parts_found: set[str] = set()  # part files present when the run began
        self._copy_method: dict[tuple[int, int], int] = {}  # (source dev, target dev) -> first way that works

    def run(self, files: list[RemoteFile]) -> Summary:
        started = time.monotonic()
        destinations = self._plan(files)
        os.makedirs(self.target, exist_ok=True)
        own_state_directory(self.target, self.log)
        own_directory(self.parts, self.log)
        manifest = self._load_manifest()
        self._manifest = dict(manifest)
        summary = Summary(files=len(files))
        todo = []
        for file in files:
            entry = manifest.get(file.path)
            if (
                entry
                and entry.get("version") == file.version
                and entry.get("size") == file.size
                and _regular_size(destinations[file.path]) == file.size
            ):
                summary.skipped += 1
            else:
                todo.append(file)
        total = sum(f.size or 0 for f in todo)
        self._parts_found = set(os.listdir(self.parts)) if todo else set()
        ours(self.journal_path, self.log)  # its lines are read already; only ours is appended to
        journal = os.fdopen(os.open(self.journal_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | NO_LINK, 0o666), "a")
        self._committer = Committer(self.target, journal, self._manifest)
        try:
            try:
                summary = self._run(todo, destinations, summary, total)
            except BaseException:
                with contextlib.suppress(Exception):  # keep what finished; the first failure is the one to report
                    self._committer.close()
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

    def _ranged(self, file: RemoteFile) -> bool:
        return file.size is not None and file.size >= self.ranged_min and self.source.supports_range

    def _run(self, todo, destinations, summary: Summary, total: int) -> Summary:
        """``concurrency`` workers, each taking the next file as it finishes one (on_lanes)."""
        resumed: list[int] = []
        with Progress(len(todo), total, self.log) as progress:
            self._lanes = Lanes(self.concurrency, lambda: progress.bytes, min(self.chunk_size, RANGE_CHUNK))

            def fetch(file: RemoteFile) -> None:
                resumed.append(self._fetch_with_retries(file, destinations[file.path], progress))

            on_lanes(todo, fetch, self.concurrency, name="fetch")
        summary.fetched = len(todo)
        summary.bytes_fetched = progress.bytes
        summary.resumed_bytes += sum(resumed)
        return summary

    def _load_manifest(self) -> dict:
        """The manifest, with the journal of a run that did not finish folded in (a torn last
        line from a crash is ignored: that file is simply fetched again)."""
        files = read_json(self.manifest_path).get("files", {})
        files = files if isinstance(files, dict) else {}
        for line in (read_state(self.journal_path) or b"").splitlines():
            try:
                entry = json.loads(line)
                files[entry.pop("path")] = entry
            except (ValueError, KeyError, AttributeError, TypeError):
                continue
        return files

    def _fold_manifest(self) -> None:
        """Fold the journal in (the committer already made every listed file durable)."""
        write_json(self.manifest_path, {"files": self._manifest})
        os.unlink(self.journal_path)

    def _fetch_with_retries(self, file: RemoteFile, destination: str, progress: Progress) -> int:
        self._lanes.enter()
        try:
            return self._fetch_retried(file, destination, progress)
        finally:
            self._lanes.leave()

    def _fetch_retried(self, file: RemoteFile, destination: str, progress: Progress) -> int:
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
        has_part = bool(attempt or f"{ident}.part" in self._parts_found) and ours(part, self.log)
        meta = read_json(meta_path) if has_part else {}
        same_source = (
            has_part
            and meta.get("version") == file.version
            and meta.get("path") == file.path
            and self.source.supports_range
        )
        local_path = getattr(self.source, "local_path", None)
        local = local_path(file) if local_path is not None else None
        if local is not None:
            start, resumed, has_meta = self._copy_local(
                file, local, part, meta_path, meta if same_source else {}, progress
            )
            return self._commit(
                file, part, meta_path if has_meta or meta else None, None, start, destination, progress, resumed
            )
        if self._ranged(file):
            resumed, digest = fetch_ranges(
                self.source, file, part, meta_path, meta if same_source else {}, progress, self.chunk_size, self._lanes
            )
            start = os.lstat(part).st_size
        else:
            start, checksum, resumed = self._fetch_stream(file, part, meta_path, same_source, progress)
            digest = checksum.hexdigest()
        if file.size is not None and start != file.size:
            if start > file.size:
                os.unlink(part)
            raise TransientError(f"got {start} of {file.size} bytes")
        wrote_meta = self._ranged(file) or file.size is None or file.size > self.chunk_size  # as the fetches decide
        return self._commit(
            file, part, meta_path if meta or wrote_meta else None, digest, start, destination, progress, resumed
        )

    def _fetch_stream(self, file: RemoteFile, part: str, meta_path: str, same_source: bool, progress: Progress):
        """One sequential stream, resumed from the end of a partial file of the same version."""
        start = 0
        checksum = Checksum(file.checksum[0] if file.checksum else None, file.size)
        if same_source:
            with open_part(part, "rb") as existing:  # re-hash what is there: it must still verify
                while block := existing.read(1 << 20):
                    checksum.update(block)
                    start += len(block)
            if file.size is not None and start > file.size:
                start, checksum = 0, Checksum(file.checksum[0] if file.checksum else None, file.size)
        elif file.size is None or file.size > self.chunk_size:  # worth resuming: remember the version
            write_json(meta_path, {"path": file.path, "version": file.version}, durable=False)
        resumed = start
        complete = file.size is not None and start >= file.size  # all there: only verify
        with open_part(part, "ab" if start else "wb") as out:
            try:
                for chunk in () if complete else self.source.read(file, start, self.chunk_size):
                    out.write(chunk)
                    checksum.update(chunk)
                    start += len(chunk)
                    progress.add(len(chunk))
            except CorruptDataError:
                os.unlink(part)
                raise
            out.flush()
            start_writeback(out.fileno(), start)
        return start, checksum, resumed

    def _commit(
        self,
        file: RemoteFile,
        part: str,
        meta_path: str | None,
        digest: str | None,
        start: int,
        destination: str,
        progress: Progress,
        resumed: int,
    ) -> int:
        """Verified: hand the part to the committer, which renames it once its bytes are durable."""
        if file.checksum and digest != file.checksum[1]:
            os.unlink(part)
            raise TransientError(f"{file.checksum[0]} mismatch: expected {file.checksum[1]}, got {digest}")
        directory = os.path.dirname(destination)
        if directory not in self._directories:
            os.makedirs(directory, exist_ok=True)
            self._directories.add(directory)
        entry = {
            "size": start,
            "version": file.version,
            "checksum": f"{file.checksum[0]}:{file.checksum[1]}" if file.checksum else None,
        }
        if self._committer is None:  # made by run() before any file is fetched
            raise RuntimeError("a file is committed before the engine runs")
        self._committer.add(Done(part, destination, meta_path, file.path, entry), start)
        progress.add(files=1)
        return resumed

    def _copy_local(
        self, file: RemoteFile, source_path: str, part: str, meta_path: str, meta: dict, progress: Progress
    ) -> tuple[int, int, bool]:
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
                write_json(
                    meta_path, {"path": file.path, "version": file.version, "source": list(before)}, durable=False
                )
                has_meta = True
            out = os.open(part, os.O_WRONLY | os.O_CREAT | (0 if start else os.O_TRUNC) | NO_LINK, 0o666)
            try:
                end = self._kernel_copy(source, out, start, size, progress)
                start_writeback(out, size)
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
