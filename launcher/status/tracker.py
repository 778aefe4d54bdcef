"""What the job has shown of its progress: step, total, metrics, per-rank steps, percent and ETA.

Pure: every source's observations come in with the time they were seen (monotonic seconds,
from the caller), so tests drive it with their own clock.
"""

from __future__ import annotations

from collections import deque

from launcher.status.lines import Observation

# The ETA follows the step rate over about this many recent seconds: long enough to smooth a
# noisy loop, short enough to follow a change of pace (evaluation, a slower phase).
RATE_WINDOW = 60.0
_SPACING = 0.5
_MAX_POINTS = 1024  # RATE_WINDOW / _SPACING, with room


class Tracker:
    def __init__(self, max_metrics: int = 256):
        self.max_metrics = max_metrics
        self.first_progress_at: float | None = None  # first observation of any kind
        self.progressed_at: float | None = None  # latest observation of any kind
        self.step: int | None = None
        self.total: int | None = None
        self.ranks: dict[int, tuple[int | None, float]] = {}  # rank -> (its last step, when)
        self._metrics: dict[str, str] = {}
        self._lead_rank: int | None = None  # the lowest rank seen: its step is the job's
        self._points: deque[tuple[float, int]] = deque(maxlen=_MAX_POINTS)  # (when, step), distinct steps
        self._relayed_percent: tuple[float, float] | None = None  # (percent, when)
        self._relayed_eta: tuple[float, float] | None = None  # (seconds, when)

    def observe(self, obs: Observation, now: float) -> None:
        if self.first_progress_at is None:
            self.first_progress_at = now
        self.progressed_at = now
        if obs.rank is not None:
            previous = self.ranks.get(obs.rank)
            step = obs.step if obs.step is not None else (previous[0] if previous else None)
            self.ranks[obs.rank] = (step, now)
            if self._lead_rank is None or obs.rank < self._lead_rank:
                self._lead_rank = obs.rank
        # Every rank may report its own step; the job's is the lowest rank's (or a rank-less
        # source's, like rank 0's output lines), so it does not jump between laggards and leaders.
        if obs.step is not None and (obs.rank is None or obs.rank == self._lead_rank):
            self._step(obs.step, now)
        if obs.total is not None and obs.total > 0:
            self.total = obs.total
        if obs.percent is not None:
            self._relayed_percent = (obs.percent, now)
        if obs.eta is not None:
            self._relayed_eta = (obs.eta, now)
        for name, value in obs.metrics:
            if name in self._metrics or len(self._metrics) < self.max_metrics:
                self._metrics[name] = value

    def restarted(self) -> None:
        """The job's processes start again in place: they have reported nothing yet (a hang is
        timed from their start again, and each rank's last step is forgotten). The job's step and
        metrics stay until the new processes report theirs."""
        self.first_progress_at = self.progressed_at = None
        self.ranks.clear()
        self._lead_rank = None
        self._points.clear()

    def _step(self, step: int, now: float) -> None:
        if self.step is not None and step < self.step:
            self._points.clear()  # restarted (from a checkpoint, or a new bar): a new rate
        self.step = step
        points = self._points
        if points and points[-1][1] == step:
            return
        if len(points) >= 2 and now - points[-2][0] < _SPACING:
            points[-1] = (now, step)  # a fast loop: one point per _SPACING is plenty for a rate
        else:
            points.append((now, step))
        while len(points) > 2 and points[1][0] <= now - RATE_WINDOW:
            points.popleft()

    def percent(self) -> int | None:
        """floor(step/total), capped at 99: only the final status of a success says 100.
        A relayed percent (the HF callback's, the SDK's) newer than our last step is taken as given."""
        if self._relayed_percent is not None and self._relayed_newer(self._relayed_percent[1]):
            return max(0, min(100, int(self._relayed_percent[0])))
        if self.step is None or not self.total:
            return None
        return max(0, min(99, self.step * 100 // self.total))

    def eta(self, now: float) -> int | None:
        """Seconds left at the recent step rate, counted from the last step seen; None until two
        distinct steps. A relayed ETA newer than our last step is taken as given (less the time
        since it came)."""
        if self._relayed_eta is not None and self._relayed_newer(self._relayed_eta[1]):
            seconds, at = self._relayed_eta
            return max(0, int(seconds - max(0.0, now - at)))
        if self.step is None or not self.total or len(self._points) < 2:
            return None
        # the oldest point kept is the last one at least RATE_WINDOW before the newest (see _step)
        (first_at, first_step), (last_at, last_step) = self._points[0], self._points[-1]
        if last_step <= first_step or last_at <= first_at:
            return None
        rate = (last_step - first_step) / (last_at - first_at)
        left = max(0, self.total - self.step) / rate - max(0.0, now - last_at)
        return max(0, round(left))

    def _relayed_newer(self, at: float) -> bool:
        return not self._points or at >= self._points[-1][0]

    def metrics(self) -> list[tuple[str, str]]:
        """The latest value of each metric, in the order first seen; at most ``max_metrics``
        names (the first seen keep their places)."""
        return list(self._metrics.items())
