"""One export, whatever the destination: list what is there, hash what may be there already, send
what differs, verify it, and only then say it is complete (a manifest, or the Hub's one commit).

Only a file the destination holds at the same size is hashed before anything is sent (to tell
whether it must go); the others are hashed as they are sent, by their destination, which verifies
them with it. A destination (``s3``, ``hf``, ``file``) supplies what is special to it
(:class:`Target`); the order, the retries and the progress are here, once."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from launcher.core.workers import on_lanes
from launcher.export.checksum import digest
from launcher.export.tree import LocalFile
from launcher.initializers.errors import TransientError
from launcher.initializers.progress import Progress


class Target(Protocol):
    shown: str  # the destination, without secrets

    def forms(self, file: LocalFile, there: dict) -> tuple[tuple[str, ...], int]:
        """The digests that tell whether ``file`` is ``there`` already, and the part size they assume."""

    def existing(self) -> dict[str, dict]:
        """What the destination holds already, by relative path: {"size": ..., and digests}."""

    def same(self, there: dict, file: LocalFile, digests: dict[str, str]) -> bool:
        """``there`` (an entry of :meth:`existing`) is this file already."""

    def begin(self, existing: dict[str, dict]) -> None:
        """Before the first byte: take back the word that an earlier export was complete."""

    def send(self, files: list[LocalFile], digests: dict[str, dict[str, str]], progress: Progress) -> None:
        """Upload ``files`` and verify each, adding each one's digests to ``digests``; a
        TransientError or PermanentError when it cannot."""

    def finish(self, files: list[LocalFile], digests: dict[str, dict[str, str]], manifest: bytes) -> None:
        """Every file is there and verified: say so (``manifest``), or check the Hub's commit."""


@dataclass
class Summary:
    files: int
    sent: int
    skipped: int
    bytes_sent: int
    seconds: float


def export(
    target: Target,
    files: list[LocalFile],
    concurrency: int,
    log: Callable[[str], None],
    describe: Callable[[list[LocalFile], dict[str, dict[str, str]]], bytes],
    sending: Callable[[Progress], None] = lambda progress: None,
) -> Summary:
    """``describe``: the manifest of the files and their digests. ``sending`` is handed the
    progress once the sending begins (the TrainJob's status reads it)."""
    started = time.monotonic()
    existing = target.existing()
    maybe_there = [f for f in files if existing.get(f.path, {}).get("size") == f.size]
    digests = _hash_all(target, maybe_there, existing, concurrency)
    needed = [f for f in files if f.path not in digests or not target.same(existing[f.path], f, digests[f.path])]
    total = sum(f.size for f in needed)
    log(
        f"export: {len(needed)} of {len(files)} files to send ({total / 1e6:.1f} MB), "
        f"{len(files) - len(needed)} already in {target.shown}"
    )
    target.begin(existing)
    with Progress(len(needed), total, lambda line: log(f"export: {line}")) as progress:
        sending(progress)
        target.send(needed, digests, progress)
    target.finish(files, digests, describe(files, digests))
    return Summary(len(files), len(needed), len(files) - len(needed), total, time.monotonic() - started)


def _hash_all(
    target: Target, files: list[LocalFile], existing: dict[str, dict], concurrency: int
) -> dict[str, dict[str, str]]:
    digests: dict[str, dict[str, str]] = {}

    def one(file: LocalFile) -> None:
        forms, part = target.forms(file, existing[file.path])
        digests[file.path] = digest(file.real, file.size, forms, part)

    on_lanes(files, one, concurrency, name="export-lane")
    return digests


def backoff(attempt: int, first: float = 0.25) -> None:
    """Wait before try ``attempt + 2``: exponential from ``first``, at most 10 s, with jitter."""
    time.sleep(min(10.0, first * 2**attempt) * (0.5 + random.random() / 2))


def each(
    files: list[LocalFile],
    send_one: Callable[[LocalFile], None],
    lanes: int,
    progress: Progress,
    retries: int = 6,
    stop: threading.Event | None = None,
) -> None:
    """``send_one`` over ``files`` on ``lanes`` threads; a TransientError is retried with backoff
    (``retries`` times a file), anything else stops the rest and is raised."""
    stop = stop or threading.Event()

    def with_retries(file: LocalFile) -> None:
        for attempt in range(retries + 1):
            if stop.is_set():
                return
            try:
                send_one(file)
                progress.add(file.size, 1)
                return
            except TransientError:
                if attempt == retries:
                    raise
                backoff(attempt)

    on_lanes(files, with_retries, lanes, stop, name="export-lane")
