"""When a job has stopped making progress, and how to say so. Pure: the clock is passed in.

Progress is whatever the tracker saw (output lines, ``launcher.progress.report``, the progress
file, relayed status posts). A job is hung when, after its first progress, nothing progressed for
the timeout, or when one rank that reports its own progress fell silent for the timeout while the
others went on. Before the first progress only the startup allowance applies (a first step may
take long: dataset download, compilation), and only when it is set.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from launcher.frameworks import every as frameworks

if TYPE_CHECKING:
    from launcher.status.stacks import RankStacks
    from launcher.status.tracker import Tracker

# The termination message must fit Kubernetes' 4 KiB with the rest of the outcome; past that the
# outcome drops ``extra`` altogether, so message and details stay well below it together.
MESSAGE_LIMIT = 1000
EXTRA_BUDGET = 1536
FRAMES_IN_EXTRA = 3
MESSAGE_RANKS = 8  # where each rank is, in the message; every rank's stack is in the log
MESSAGE_STOPPED = 16
EXTRA_STOPPED = 64
# Ranks whose last reports are closer than this count as having stopped together.
_TOGETHER = 1.0
# A frame inside a collective: one of any framework's library (whatever the job's own framework:
# mpirun runs programs of the others too), or a function named as a collective is.
_COLLECTIVE = re.compile(
    "|".join(
        [
            *(frame for framework in frameworks() for frame in framework.collective_frames),
            r"in (?:all_reduce|allreduce|barrier|broadcast|all_gather|allgather|reduce_scatter"
            r"|Barrier|Allreduce|Bcast)\b",
        ]
    )
)
# A source line that calls one, for collectives no Python frame shows (mpi4py's are compiled).
_CALLS_COLLECTIVE = re.compile(
    r"\.(?:all_?reduce|Allreduce|[Bb]arrier|[Bb]cast|broadcast|all_?gather|Allgather|"
    r"reduce_scatter|Reduce_scatter|gather|Gather|scatter|Scatter|reduce|Reduce|"
    r"alltoall|Alltoall|[Ww]ait(?:all)?)\s*\("
)


@dataclass(frozen=True)
class Hang:
    stalled_for: float  # seconds since the last progress (or since start)
    last_step: int | None
    stopped_ranks: tuple[int, ...]  # ranks whose own progress stopped first / are behind; () when unknown
    before_first_progress: bool


class HangWatch:
    def __init__(self, timeout: float, startup: float | None, started_at: float):
        self.timeout, self.startup, self.started_at = timeout, startup, started_at

    def check(self, tracker: Tracker, now: float) -> Hang | None:
        if self.timeout <= 0:
            return None
        if tracker.first_progress_at is None or tracker.progressed_at is None:
            if self.startup and now - self.started_at > self.startup:
                return Hang(now - self.started_at, None, (), True)
            return None
        if now - tracker.progressed_at > self.timeout:
            return Hang(now - tracker.progressed_at, tracker.step, _behind(tracker.ranks), False)
        silent = self._silent_ranks(tracker.ranks)
        if silent:
            since = min(tracker.ranks[rank][1] for rank in silent)
            return Hang(now - since, tracker.step, silent, False)
        return None

    def _silent_ranks(self, ranks: dict[int, tuple[int | None, float]]) -> tuple[int, ...]:
        """Ranks that went quiet while another rank kept going for the timeout, and got further
        (when both say their step)."""
        silent = []
        for rank, (step, when) in ranks.items():
            for other, (other_step, other_when) in ranks.items():
                further = step is None or other_step is None or other_step > step
                if other != rank and other_when - when > self.timeout and further:
                    silent.append(rank)
                    break
        return tuple(sorted(silent))


def _behind(ranks: dict[int, tuple[int | None, float]]) -> tuple[int, ...]:
    """The ranks behind the others, by step when every rank says it, else by when they last
    reported; () when they all stopped together."""
    if len(ranks) < 2:
        return ()
    steps = [step for step, _ in ranks.values() if step is not None]
    if len(steps) == len(ranks):  # every rank says its step
        lowest, highest = min(steps), max(steps)
        return tuple(sorted(r for r, (s, _) in ranks.items() if s == lowest)) if lowest < highest else ()
    times = [when for _, when in ranks.values()]
    latest = max(times)
    if latest - min(times) <= _TOGETHER:
        return ()
    return tuple(sorted(r for r, (_, when) in ranks.items() if latest - when > _TOGETHER))


def waiting_on_others(stacks: list[RankStacks], hang: Hang) -> Hang:
    """Name the ranks that stopped when progress cannot: after a collective that one rank never
    joined, every rank reported the same last step, but the others wait inside the collective and
    the one that stopped is somewhere else. Only when some ranks are in a collective and some not."""
    if hang.stopped_ranks:
        return hang
    ranked = [(found.rank, found.top) for found in stacks if found.rank is not None and found.top]
    waiting = {rank for rank, top in ranked if _in_collective(top)}
    elsewhere = tuple(sorted(rank for rank, _ in ranked if rank not in waiting))
    if not waiting or not elsewhere:
        return hang
    return replace(hang, stopped_ranks=elsewhere)


def _in_collective(top: tuple[str, ...]) -> bool:
    """A frame inside a collective, or an innermost frame whose source line calls one (read
    where the file is on this machine: the same image on every pod, or a rank on this one)."""
    if any(_COLLECTIVE.search(frame) for frame in top):
        return True
    import linecache

    where, _, _ = top[0].rpartition(" in ")
    path, _, line = where.rpartition(":")
    return line.isdigit() and bool(_CALLS_COLLECTIVE.search(linecache.getline(path, int(line))))


def describe(hang: Hang, stacks: list[RankStacks], node: str | None = None) -> tuple[str, dict]:
    """The one-line message and the termination message's extra fields for a hang."""
    if hang.before_first_progress:
        what = f"no progress reported in the first {hang.stalled_for:.0f}s (startup allowance)"
    else:
        what = f"no progress for {hang.stalled_for:.0f}s"
        if hang.last_step is not None:
            what += f" after step {hang.last_step}"
    parts = [what + (f" on {node}" if node else "")]
    if hang.stopped_ranks:
        named = ",".join(map(str, hang.stopped_ranks[:MESSAGE_STOPPED]))
        more = len(hang.stopped_ranks) - MESSAGE_STOPPED
        parts.append(f"stopped: rank {named}" + (f" and {more} more" if more > 0 else ""))
    # The stopped ranks first; a big job's message is cut short anyway (the log has every stack).
    shown = sorted((s for s in stacks if s.top), key=lambda s: s.rank not in hang.stopped_ranks)
    where = [f"{_who(found)} in {_where(found.top)}" for found in shown[:MESSAGE_RANKS]]
    if len(shown) > MESSAGE_RANKS:
        where.append(f"{len(shown) - MESSAGE_RANKS} more ranks in the log")
    if where:
        parts.append("; ".join(where))
    elif not stacks:
        parts.append("no Python stacks (ranks not Python, or gone)")
    message = "; ".join(parts)
    if len(message) > MESSAGE_LIMIT:
        message = message[: MESSAGE_LIMIT - 3] + "..."
    detail: dict = {
        "stalledForSeconds": round(hang.stalled_for),
        "lastStep": hang.last_step,
        "stoppedRanks": list(hang.stopped_ranks[:EXTRA_STOPPED]),
        "beforeFirstProgress": hang.before_first_progress,
    }
    if len(hang.stopped_ranks) > EXTRA_STOPPED:
        detail["stoppedRanksOmitted"] = len(hang.stopped_ranks) - EXTRA_STOPPED
    frames: dict[str, list[str]] = {}
    for found in stacks:
        frames[_key(found)] = [_short(frame) for frame in found.top[:FRAMES_IN_EXTRA]]
        if _size({**detail, "stacks": frames}) > EXTRA_BUDGET:
            del frames[_key(found)]
            detail["stacksOmitted"] = len(stacks) - len(frames)
            break
    detail["stacks"] = frames
    return message, {"hang": detail}


def _who(found: RankStacks) -> str:
    who = f"rank {found.rank}" if found.rank is not None else f"pid {found.pid}"
    return f"{who} on {found.node}" if found.node else who


def _key(found: RankStacks) -> str:
    return str(found.rank) if found.rank is not None else f"pid {found.pid}"


def _where(top: tuple[str, ...]) -> str:
    """The innermost frame, and the innermost frame of the user's own code when that is another
    (a rank in a collective is in its framework's library; where the program called it says more)."""
    shown = _short(top[0])
    own = next((frame for frame in top if not _library(frame)), None)
    if own is not None and own != top[0]:
        shown += f" <- {_short(own)}"
    return shown


def _library(frame: str) -> bool:
    path = frame.rsplit(":", 1)[0]
    return "-packages" + os.sep in path or os.sep + "lib" + os.sep + "python" in path


def _short(frame: str) -> str:
    """``/long/path/file.py:12 in f`` -> ``file.py:12 in f``."""
    path, _, rest = frame.rpartition(":")
    return f"{os.path.basename(path)}:{rest}" if path else frame


def _size(data: dict) -> int:
    return len(json.dumps(data, separators=(",", ":")).encode())
