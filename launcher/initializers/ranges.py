"""A large file fetched as byte ranges written in place, resumable by segment.

The file is cut into segments (about 32, each a whole number of the multipart checksum's parts).
A stream reads from its first segment on and claims each next segment as it reaches it; each
finished segment goes into the resume record, with its parts' md5s, so a rerun after a crash
fetches only the segments that were not complete, and the file is never read a second time to
be verified. A fresh file starts as one stream from byte 0: a plain GET. When a lane is free and
``Lanes.split`` says one more stream pays, the longest run of segments nobody has claimed is
split: a new stream takes its second half, and the stream reading toward it stops where that half
begins (``Segments`` is the bookkeeping, without I/O)."""

from __future__ import annotations

import os
import re
import threading
from concurrent.futures import Future, ThreadPoolExecutor

from launcher.initializers.checksum import Checksum, multipart_etag
from launcher.initializers.errors import CorruptDataError, TransientError
from launcher.initializers.lanes import Lanes
from launcher.initializers.listing import RemoteFile, Source
from launcher.initializers.progress import Progress
from launcher.initializers.state import NO_LINK, open_part, write_json

SEGMENTS = 32  # a file's segments: the granularity of a split and of a resume
CHUNK = 1 << 20  # the most a stream reads before it counts its bytes: what the lanes' rate is measured in

_MD5_HEX = re.compile(r"[0-9a-f]{32}")


def segment_size(size: int, chunk_size: int, part_size: int) -> int:
    segment = max(chunk_size, -(-size // SEGMENTS))
    return -(-segment // part_size) * part_size if part_size else segment


class Segments:
    """Which segments of a file are done, which a stream has claimed, and where a new stream
    starts. Not thread-safe: the caller holds its lock."""

    def __init__(self, size: int, segment: int, done: set[int]):
        self.size, self.segment = size, segment
        self.done = set(done)
        self.claimed = set(done)

    def offsets(self) -> range:
        return range(0, self.size, self.segment)

    def run_end(self, start: int) -> int:
        """The end (a byte offset) of the unclaimed segments from ``start`` on."""
        end = start
        while end < self.size and end not in self.claimed:
            end += self.segment
        return min(end, self.size)

    def _read_toward(self, offset: int) -> bool:
        """A stream is reading toward ``offset``: it claimed the segment before and has not
        finished it (finishing and claiming the next happen under one lock)."""
        before = offset - self.segment
        return before >= 0 and before in self.claimed and before not in self.done

    def first_free(self) -> int | None:
        """The first segment nobody has claimed and no stream is reading toward (a file's start, or
        a gap a resume left). Taking one a stream is reading toward only hands its rest to a new
        request: no more streams, one more GET."""
        starts = (o for o in self.offsets() if o not in self.claimed and (o == 0 or o - self.segment in self.claimed))
        return next((o for o in starts if not self._read_toward(o)), None)

    def take_over(self) -> int | None:
        """Where one more stream should start: in the longest unclaimed run of two segments or
        more, its middle when a stream is reading toward it, its start when none is (a gap a
        resume left); None when no run is that long."""
        best: tuple[int, int] | None = None  # (segments, start)
        start = None
        for offset in [*self.offsets(), self.size]:
            if offset < self.size and offset not in self.claimed:
                start = offset if start is None else start
                continue
            if start is not None:
                count = len(range(start, offset, self.segment))
                if count >= 2 and (best is None or count > best[0]):
                    best = (count, start)
                start = None
        if best is None:
            return None
        count, start = best
        return start + (count // 2) * self.segment if self._read_toward(start) else start

    def next(self, finished: int, end: int) -> int | None:
        """A stream finished the segment at ``finished`` (the caller marks it done); its request ends at ``end``: the
        segment it goes on to (now claimed), or None when it stops there."""
        following = finished + self.segment
        if following >= end or following in self.claimed:
            return None
        self.claimed.add(following)
        return following


def fetch_ranges(
    source: Source,
    file: RemoteFile,
    part: str,
    meta_path: str,
    meta: dict,
    progress: Progress,
    chunk_size: int,
    lanes: Lanes,
) -> tuple[int, str | None]:
    """Fetch ``file`` into ``part`` (resuming from ``meta``, the record of an earlier run of the
    same version, or {}). Returns (bytes resumed, the file's digest in its checksum's kind)."""
    size = file.size
    if size is None:  # only a file of known size is fetched in ranges
        raise ValueError(f"{file.path}: byte ranges of a file whose size is unknown")
    kind = file.checksum[0] if file.checksum else None
    part_size = Checksum(kind, size).part_size
    segment = segment_size(size, chunk_size, part_size)
    began = meta.get("segment")
    if type(began) is int and began >= chunk_size and not began % (part_size or 1):
        segment = began  # a resume keeps the segments it began with
    kept_segments = meta.get("segments")
    done = (
        {o for o in kept_segments if type(o) is int and 0 <= o < size and o % segment == 0}
        if isinstance(kept_segments, list)
        else set()
    )
    kept = meta.get("digests")
    if not isinstance(kept, dict):
        kept = {}
    if part_size:  # a segment counts as done only with its parts' digests (the record is not trusted)
        done = {o for o in done if _part_digests_fit(kept.get(str(o)), min(o + segment, size) - o, part_size)}
    resumed = sum(min(segment, size - offset) for offset in done)
    if not done:
        with open_part(part, "wb") as out:
            out.truncate(size)
    digests: dict[str, list[str]] = {str(o): kept[str(o)] for o in done} if part_size else {}
    record: dict[str, object] = {
        "path": file.path,
        "version": file.version,
        "segment": segment,
        "segments": sorted(done),
    }
    if part_size:
        record["digests"] = digests
    write_json(meta_path, record)

    segments = Segments(size, segment, done)
    lock = threading.Lock()
    failed = threading.Event()  # one stream failed: the others stop at their next segment
    whole: list[str | None] = []  # a single-hash digest, when one stream read the file from 0 to the end
    fd = os.open(part, os.O_WRONLY | NO_LINK)
    pool = ThreadPoolExecutor(max(1, lanes.count - 1), thread_name_prefix="range")
    extra: list[Future] = []

    def finish(offset: int, hashed: Checksum, end: int) -> int | None:
        """The segment at ``offset`` is done: recorded (the part's bytes are no more durable than
        the record until the commit, so the record is not fsynced either); the next segment of
        the stream, or None."""
        with lock:
            segments.done.add(offset)
            if part_size:
                digests[str(offset)] = [d.hex() for d in hashed.part_digests()]
            record["segments"] = sorted(segments.done)
            write_json(meta_path, record, durable=False)
            return None if failed.is_set() else segments.next(offset, end)

    def more() -> None:
        """One more stream, when a lane is free and it pays."""
        with lock:
            if failed.is_set() or (start := segments.take_over()) is None or not lanes.split():
                return
            end = segments.run_end(start)
            segments.claimed.add(start)
        try:
            extra.append(pool.submit(stream, start, end, True))
        except RuntimeError:  # the pool is closing: the file is failing
            lanes.leave()

    def stream(first: int, end: int, admitted: bool = False) -> None:
        """Segments from ``first`` (claimed) while the next is free, up to ``end``."""
        try:
            offset, position, limit = first, first, min(first + segment, size)
            hashed = Checksum(kind if part_size else None, None)
            entire = Checksum(kind, size) if not part_size and first == 0 and end == size and kind else None
            chunks = source.read(file, first, min(chunk_size, CHUNK), None if end == size else end)
            told = False
            try:
                for chunk in chunks:
                    if admitted and not told and position > first:  # its first chunk is in: its trial begins
                        lanes.flowing()
                        told = True
                    view = memoryview(chunk)
                    while view:
                        piece, view = view[: limit - position], view[limit - position :]
                        os.pwrite(fd, piece, position)
                        hashed.update(piece)
                        if entire is not None:
                            entire.update(piece)
                        position += len(piece)
                        progress.add(len(piece))
                        if position < limit:
                            continue
                        following = finish(offset, hashed, end)
                        if following is None:
                            if entire is not None and position == size:
                                whole.append(entire.hexdigest())
                            return
                        offset, limit, hashed = (
                            following,
                            min(following + segment, size),
                            Checksum(kind if part_size else None, None),
                        )
                        more()
            finally:
                close = getattr(chunks, "close", None)
                if close is not None:
                    close()
            raise TransientError(f"range at {offset}: the body ended {limit - position} bytes short")
        except BaseException:
            failed.set()
            raise
        finally:
            if admitted:
                lanes.leave()

    try:
        while True:  # this file's own lane: every run nobody has claimed nor reads toward, in turn
            with lock:
                start = None if failed.is_set() else segments.first_free()
                if start is None:
                    break
                end = segments.run_end(start)
                segments.claimed.add(start)
            stream(start, end)
        while extra:
            extra.pop(0).result()
        if segments.done != set(segments.offsets()):
            raise TransientError(f"{len(segments.offsets()) - len(segments.done)} segments missing")
    except CorruptDataError:
        os.unlink(part)
        raise
    finally:
        pool.shutdown(wait=True)
        os.close(fd)
    if part_size:
        return resumed, multipart_etag([bytes.fromhex(d) for o in sorted(segments.done) for d in digests[str(o)]])
    if kind is None:
        return resumed, None
    if whole:
        return resumed, whole[0]
    checksum = Checksum(kind, size)
    with open_part(part, "rb") as written:  # ranges arrived out of order: hash in one pass
        while block := written.read(1 << 20):
            checksum.update(block)
    return resumed, checksum.hexdigest()


def _part_digests_fit(found, length: int, part_size: int) -> bool:
    """A resume record's part digests for a segment of ``length`` bytes: one md5 per part."""
    return (
        isinstance(found, list)
        and len(found) == -(-length // part_size)
        and all(_MD5_HEX.fullmatch(str(d)) for d in found)
    )
