"""The one judge: what is known of how the process that failed first ended, to a reason of the table.

Every framework gathers the same :class:`Evidence` about the process that failed first (its exit
code or signal, the lines it said itself, the kernel's OOM count for the container) and hands it to
:func:`verdict`, which alone decides between the rows. The rules, in order:

1. It exited 0: ``Succeeded``.
2. SIGKILL while the kernel's OOM killer counted a kill in this container: ``OutOfMemory``, with
   the container's limit.
3. Its own words, or the node's, show a node or network fault (NCCL's watchdog, ECC, Xid, the
   user's pattern): ``NodeFault``. A peer's echo of a loss ("connection reset by peer") is never
   such a fault: it says where the failure was not.
4. Its own words say a peer went away, and it did not crash on its own (SIGSEGV, SIGILL, SIGFPE,
   SIGBUS, SIGKILL): ``PeerLost``. Whether that peer failed on its own (then the job's root cause is
   that peer, settled across the pods by :mod:`launcher.core.job_outcome`) or vanished without a
   word (a lost pod), this process is not the one to fix. Unless every peer is known to have ended
   as it chose: then it only outlived them (a program whose ranks disagree on the steps), rule 5.
5. Otherwise its exit code or signal, as the table says (``Crashed``, ``Failed``, ``Killed``...).

Frameworks add only their library's words (which lines are whose, what their runtime prints), never
a rule of their own.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from launcher.core import memory
from launcher.core.outcome import (
    CRASH_SIGNALS,
    DEFAULT_RETRYABLE_EXIT_CODES,
    PEER_LOSS_PATTERN,
    Outcome,
    Reasons,
    RootCause,
    classify,
)

# Signals that end a process on its own account, whatever it printed before.
_OWN_DEATHS = CRASH_SIGNALS | {signal.SIGKILL}
OWN_DEATH_NAMES = frozenset(sig.name for sig in _OWN_DEATHS)  # as failure records name them


@dataclass(frozen=True)
class Evidence:
    """How the process that failed first ended, and what it said."""

    returncode: int  # Popen's: negative for the signal that ended it
    fault: str | None = None  # a line showing a node or network fault (not a peer's loss)
    peer_loss: str | None = None  # a line in which this process says a peer went away
    oom_kills: int = 0  # the kernel's OOM kills in this container while the job ran
    memory_limit: int | None = None  # the container's limit, in bytes
    # False once every peer is known to have ended as it chose (none vanished, none lost a peer
    # itself): a peer's loss in its words then says only that it outlived them, a failure of its own.
    peer_vanished: bool | None = None

    @property
    def signal(self) -> int | None:
        return -self.returncode if self.returncode < 0 else None


def gather(
    returncode: int,
    lines: Iterable[str],
    *,
    own: Callable[[str], bool] = lambda line: True,
    memory_before: memory.Memory | None = None,
) -> Evidence:
    """The evidence about one process: ``lines`` are the marked lines of its node's output (the
    supervisor keeps those that match a fault or a peer's loss); ``own`` tells which of them the
    process said itself. A fault counts unless another process said it; a peer's loss only when
    this one did. ``memory_before``: the container's memory cgroup when the job started."""
    fault = peer_loss = None
    for line in lines:
        if PEER_LOSS_PATTERN.search(line):
            if peer_loss is None and own(line):
                peer_loss = line
        elif fault is None and own(line):
            fault = line
    kills, limit = 0, None
    if returncode == -signal.SIGKILL and memory_before is not None:
        now = memory.read()
        kills, limit = now.kills_since(memory_before), now.limit
    return Evidence(returncode, fault, peer_loss, kills, limit)


def verdict(
    evidence: Evidence,
    *,
    what: str,
    root_cause: RootCause | None = None,
    codes: frozenset[int] = DEFAULT_RETRYABLE_EXIT_CODES,
) -> Outcome:
    """The one decision (the rules in this module's docstring). ``what`` names the process in the
    message ("rank 1 (local rank 1) on node-0"); ``codes``: the retryable set."""
    rc, sig = evidence.returncode, evidence.signal
    if rc == 0:
        return classify(0, root_cause=root_cause, what=what)
    if sig == signal.SIGKILL and evidence.oom_kills:
        return Outcome.of(
            Reasons.OUT_OF_MEMORY,
            f"{what} was killed by the kernel's OOM killer; {memory.describe_limit(evidence.memory_limit)}",
            root_cause,
            exit_code=128 + sig,
        )
    if evidence.fault:
        return classify(rc, retryable_codes=codes, evidence=evidence.fault, root_cause=root_cause, what=what)
    if evidence.peer_loss and sig not in _OWN_DEATHS and evidence.peer_vanished is not False:
        how = f"was killed by {signal.Signals(sig).name}" if sig else f"exited with code {rc}"
        return Outcome.of(
            Reasons.PEER_LOST,
            f"{what} {how} after a peer went away",
            root_cause,
            evidence.peer_loss,
        )
    return classify(rc, retryable_codes=codes, root_cause=root_cause, what=what)


def peer_loss(outcome: Outcome) -> bool:
    """Whether this outcome is a process that stopped because a peer went away: on its own it
    names no root cause."""
    return outcome.reason == Reasons.PEER_LOST or bool(PEER_LOSS_PATTERN.search(outcome.evidence or ""))


# What a line said by one rank of many carries: a collective library's "[rank3]: " on what a rank
# prints of its exception, the launcher's own "[rank-3]: " where it tags lines.
RANK_PREFIX = re.compile(r"^\s*(?:\[rank-\d+\]:\s?)?\[rank-?(\d+)\]:")


def said_by(line: str) -> int | None:
    """The rank a line names as its speaker, or None."""
    match = RANK_PREFIX.search(line)
    return int(match[1]) if match else None
