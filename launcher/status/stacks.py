"""Every rank's Python stacks, without ptrace.

With hang detection on, each rank's interpreter runs ``launcher/runner/hook/sitecustomize.py`` at start: it opens
``<pid>.stacks`` in :data:`STACKS_ENV`'s directory, writes a one-line header (pid, start time,
rank, local rank, the signal, the main thread's id) and registers faulthandler for a real-time
signal. :func:`collect` sends that signal to every registered rank that is still the process
that registered (a pid can be reused), waits until each dump is complete, and parses it.

faulthandler answers from its C signal handler, so a rank stuck in a C call that released the
GIL (a gloo or NCCL collective) dumps too; a rank that is not Python never registered and is never
signalled (the signal's default action would kill it).
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass

from launcher import runner

STACKS_ENV = "LAUNCHER_STACKS_DIR"
# Where ranks that find no stacks directory here reach the launcher's board (board.py):
# "<address>/<port>/<token>". Not LAUNCHER_*, which mpirun never exports.
BOARD_ENV = "TRAINER_LAUNCHER_STACKS_BOARD"
HOOK_DIR = os.path.join(os.path.dirname(os.path.abspath(runner.__file__)), "hook")  # code for the ranks' interpreters
# The modules (comma-separated, ours alone: "_trainer_launcher_*") that the hook's sitecustomize
# imports too: a framework's own code for its ranks (a hook folder in its package).
RANK_HOOKS_ENV = "TRAINER_LAUNCHER_RANK_HOOKS"
TOP_FRAMES = 5
_POLL = 0.02
_HEADER = "# trainer-launcher stacks "
_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)")
_FRAME = re.compile(r'^  File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.*)$')


def rank_env(stacks_dir: str, pythonpath: str | None) -> dict[str, str]:
    """The ranks' PYTHONPATH with the hook first (the user's entries kept, in order) and the
    directory the dumps go to."""
    return {"PYTHONPATH": hook_path(pythonpath), STACKS_ENV: stacks_dir}


def hook_path(pythonpath: str | None, *more: str) -> str:
    """``pythonpath`` with the hook first and ``more`` directories after it, each once: the hook
    may already be there (the watch put it), the other entries keep their order."""
    ours = [HOOK_DIR, *more]
    rest = [entry for entry in (pythonpath or "").split(os.pathsep) if entry and entry not in ours]
    return os.pathsep.join(ours + rest)


@dataclass(frozen=True)
class RankStacks:
    pid: int
    rank: int | None
    local_rank: int | None
    text: str  # faulthandler's whole dump
    top: tuple[str, ...]  # the main thread's innermost frames, "file:line in func", at most 5
    node: str | None = None  # where it runs, when taken on another node (by its node's agent)


@dataclass
class _Registered:
    path: str
    pid: int
    rank: int | None
    local_rank: int | None
    signum: int
    main: int | None
    offset: int = 0  # where this signal's dump starts in the file
    size: int = -1  # the file's size at the previous poll
    blockers: frozenset[str] = frozenset()  # its threads that blocked the signal before we sent it
    text: str = ""
    done: bool = False


def collect(stacks_dir: str, wait: float = 3.0) -> list[RankStacks]:
    """Signal every live registered rank, wait (at most ``wait`` seconds) until each dump is
    complete, and read them; ordered by rank. A rank that does not answer in time is left out."""
    deadline = time.monotonic() + wait
    pending = []
    for entry in _registered(stacks_dir):
        try:
            entry.offset = os.path.getsize(entry.path)
            entry.blockers = frozenset(_signal_state(entry.pid, entry.signum)[1])
            os.kill(entry.pid, entry.signum)
        except OSError:
            continue  # gone since we looked
        pending.append(entry)
    found = []
    while pending:
        for entry in list(pending):
            if _poll(entry):
                pending.remove(entry)
                found.append(entry)
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(_POLL)
    for entry in pending:  # too slow to finish: what it wrote so far still helps
        if entry.text.strip():
            found.append(entry)
    return by_rank([RankStacks(e.pid, e.rank, e.local_rank, e.text, top_frames(e.text, e.main)) for e in found])


def by_rank(stacks: list[RankStacks]) -> list[RankStacks]:
    return sorted(stacks, key=lambda s: (s.rank is None, s.rank if s.rank is not None else 0, s.pid))


def echo(stacks: list[RankStacks], write) -> None:
    """Each rank's dump, every line prefixed by the rank, for the job's log."""
    for found in stacks:
        who = f"rank {found.rank}" if found.rank is not None else f"pid {found.pid}"
        where = f" on {found.node}" if found.node else ""
        write(f"[stacks {who}] pid {found.pid}{where}, local rank {found.local_rank}:")
        for line in found.text.rstrip("\n").splitlines():
            if line:
                write(f"[stacks {who}] {line}")


def parse_threads(text: str) -> list[tuple[int, bool, list[str]]]:
    """faulthandler's dump -> [(thread id, is the dumping thread, frames innermost first)]."""
    threads: list[tuple[int, bool, list[str]]] = []
    for line in text.splitlines():
        if match := _THREAD.match(line):
            threads.append((int(match[2], 16), match[1] == "Current thread", []))
        elif threads and (frame := _FRAME.match(line)):
            threads[-1][2].append(f"{frame['file']}:{frame['line']} in {frame['func']}")
    return threads


def top_frames(text: str, main: int | None) -> tuple[str, ...]:
    threads = parse_threads(text)
    chosen = next((t for t in threads if t[0] == main), None)
    if chosen is None:  # no header id (another hook's file): the dumping thread, else the last
        chosen = next((t for t in threads if t[1]), threads[-1] if threads else None)
    return tuple(chosen[2][:TOP_FRAMES]) if chosen else ()


def _poll(entry: _Registered) -> bool:
    """Read what the dump added; True once it is complete: the main thread's frames are there and
    the file stopped growing (faulthandler writes the whole dump inside one signal handler)."""
    try:
        size = os.path.getsize(entry.path)
        with open(entry.path, "rb") as handle:
            handle.seek(entry.offset)
            entry.text = handle.read(max(0, size - entry.offset)).decode("utf-8", "replace")
    except OSError:
        return False
    complete = entry.text.endswith("\n") and _has_main(entry.text, entry.main)
    settled = size == entry.size
    entry.size = size
    return complete and settled and not _handling(entry)


def _handling(entry: _Registered) -> bool:
    """The signal is still pending, or a thread is inside faulthandler's handler: registered
    without chaining (no SA_NODEFER), it blocks the signal while it writes. A busy machine may
    pause a dump halfway, so a file that stopped growing is not enough. Threads that blocked the
    signal before it was sent block it for good and say nothing."""
    pending, blocked = _signal_state(entry.pid, entry.signum)
    return bool(pending) or bool(blocked - entry.blockers)


def _signal_state(pid: int, signum: int) -> tuple[set[str], set[str]]:
    """The process's threads that have ``signum`` pending, and those that block it, from one read
    of each thread's /proc status."""
    bit = 1 << (signum - 1)
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return set(), set()  # gone: it will write nothing more
    pending: set[str] = set()
    blocked: set[str] = set()
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/status") as handle:
                for line in handle:
                    if line.startswith(("SigPnd:", "ShdPnd:", "SigBlk:")) and int(line.split()[1], 16) & bit:
                        (blocked if line.startswith("SigBlk:") else pending).add(task)
        except (OSError, ValueError, IndexError):
            continue
    return pending, blocked


def _has_main(text: str, main: int | None) -> bool:
    threads = parse_threads(text)
    if main is None:
        return bool(threads)
    return any(ident == main and (frames or "<no Python frame>" in text) for ident, _, frames in threads)


def _registered(stacks_dir: str) -> list[_Registered]:
    """The registered ranks that are still the processes that registered."""
    try:
        names = sorted(os.listdir(stacks_dir))
    except OSError:
        return []
    found = []
    for name in names:
        if not name.endswith(".stacks"):
            continue
        path = os.path.join(stacks_dir, name)
        header = _header(path)
        if header is None:
            continue
        try:
            pid, start, signum = int(header["pid"]), int(header["start"]), int(header["signal"])
        except (KeyError, ValueError):
            continue
        if pid in (0, os.getpid()) or _start_time(pid) != start:
            continue  # exited, or its pid now belongs to another process
        found.append(
            _Registered(
                path,
                pid,
                _int(header.get("rank")),
                _int(header.get("local_rank")),
                signum,
                _int(header.get("main"), 16),
            )
        )
    return found


def _header(path: str) -> dict[str, str] | None:
    try:
        with open(path, "rb") as handle:
            first = handle.readline(1024).decode("utf-8", "replace")
    except OSError:
        return None
    if not first.startswith(_HEADER) or not first.endswith("\n"):
        return None
    return dict(item.partition("=")[::2] for item in first[len(_HEADER) :].split())


def _start_time(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
        if stat[stat.rindex(b")") + 2 :].split()[0] == b"Z":
            return None  # a zombie dumps nothing
        return int(stat[stat.rindex(b")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _int(text: str | None, base: int = 10) -> int | None:
    try:
        return int(text, base) if text else None
    except ValueError:
        return None
