"""The download's lanes: how many transfers run at once, and when one more stream on a large file pays.

``--concurrency`` is the number of transfers at once, byte ranges included. Every file starts as
one stream; a large one as a plain GET from its first missing byte, the request any server serves
at its lowest cost. A lane that would otherwise idle may take the second half of what a large file
has left, as a ranged GET, but only while that raises the download's rate.

Each such split is a trial: the rate over a window after it against the rate over the window
before (a window: at least 0.3 s and eight chunks per stream, since bytes arrive a chunk at a
time). The trial's window opens when its stream's first chunk is in (``flowing``): the time to the
first byte is not its rate. A split that brings less than half of what an average stream brings
ends the splitting for the run: the server reads the whole object to serve a range (moto), or the
machine is already at its limit. One that brings more lets the next trial begin at once. A stream
that starts or ends for another reason (a file done, the next begun) voids the window: the rate
changed for a reason the trial did not cause, so the measurement starts again."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

WINDOW = 0.3  # the shortest window a rate is measured over: in seconds,
CHUNKS = 8  # and in chunks per stream


class Lanes:
    def __init__(
        self,
        count: int,
        transferred: Callable[[], int],
        chunk: int,
        clock: Callable[[], float] = time.monotonic,
        window: float = WINDOW,
    ):
        self.count, self._transferred, self._chunk = count, transferred, chunk
        self._clock, self._window = clock, window
        self._lock = threading.Lock()
        self.busy = 0
        self.trials = 0  # splits made (what a test of the rule counts)
        self.closed = False  # a trial did not pay: no more splits in this run
        self._mark: tuple[float, int] | None = None  # (time, bytes) where the current window began
        self._before: tuple[float, int] | None = None  # a trial's reference: (rate before it, streams before it)
        self._awaited = False  # a trial's stream has not delivered its first bytes yet

    def enter(self) -> None:
        """A file's own stream begins (it holds one lane until leave())."""
        with self._lock:
            self.busy += 1
            self._void()

    def leave(self) -> None:
        """A stream ends (a file's own, or one that split() admitted)."""
        with self._lock:
            self.busy -= 1
            self._void()

    def _void(self) -> None:
        self._mark, self._before, self._awaited = None, None, False

    def flowing(self) -> None:
        """The first bytes of a stream that split() admitted: its trial's window opens."""
        with self._lock:
            if self._awaited:
                self._awaited = False
                self._mark = (self._clock(), self._transferred())

    def split(self) -> bool:
        """Whether the caller may start one more stream now. True: it holds a lane (leave() when
        that stream ends), and the trial of that stream has begun."""
        with self._lock:
            if self.closed or self.busy >= self.count:
                return False
            if self._awaited:
                return False
            now, done = self._clock(), self._transferred()
            if self._mark is None:
                self._mark = (now, done)
                return False
            began, at = self._mark
            if now - began < self._window or done - at < CHUNKS * self._chunk * self.busy:
                return False
            rate = (done - at) / (now - began)
            if self._before is not None:
                before, streams = self._before
                if rate < before * (1 + 0.5 / streams):
                    self.closed = True
                    return False
            self._before = (rate, self.busy)
            self._mark, self._awaited = None, True
            self.busy += 1
            self.trials += 1
            return True
