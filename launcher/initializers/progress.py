"""The transfer's progress, logged while it runs."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable


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
        return (
            f"{self.files}/{self.total_files} files, {self.bytes / 1e6:.1f}/{self.total_bytes / 1e6:.1f} MB, "
            f"{rate / 1e6:.1f} MB/s{eta}"
        )

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            if self.tty:
                sys.stderr.write(f"\r{self.line()}\033[K")
                sys.stderr.flush()
            else:
                self.log(self.line())
