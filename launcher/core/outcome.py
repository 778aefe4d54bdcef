"""The one file that builds outcomes, from the one table of reasons (:mod:`launcher.core.reasons`).

Everything that ends a launcher run (a rank's exit, a signal the launcher received, a wait
that timed out, bad configuration) becomes an :class:`Outcome` here and nowhere else: through
:meth:`Outcome.of` (a reason from the table and a message; the reason gives the exit code) or the
factories below (:func:`classify`, :func:`terminated`, ...), which call it. Classification decides
only the reason and the exit code. Whether that code is retryable is decided by one function,
:func:`is_retryable`, from the code and the retryable set, and only when the outcome is
delivered; the runtimes' failure policies (:mod:`launcher.core.failure_policy`) are derived from the
same set. So the exit code, ``retryable`` in the termination message and the policy cannot
disagree.
"""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Protocol

from launcher.core.crash import crash_site, describe

# The codes, the retryable set and its one decision live with the table; importable from here too.
from launcher.core.reasons import (  # noqa: F401
    COMMAND_NOT_FOUND,
    CONFIG_ERROR,
    DEFAULT_RETRYABLE_EXIT_CODES,
    INTERNAL_ERROR,
    NOT_EXECUTABLE,
    PEER_LOSS_WORDS,
    SUCCESS,
    TRANSIENT,
    Reason,
    Reasons,
    is_retryable,
)

# Killed by these, a rank crashed on its own (permanent under the default set), unless its output
# shows a hardware fault.
LAST_LINES = 5  # of a failed child's output, in its outcome
CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGILL, signal.SIGFPE, signal.SIGBUS})

# Output that marks a failure as a node or network fault rather than a bug in the program.
NODE_FAULT_PATTERNS: tuple[str, ...] = (
    r"Watchdog caught collective operation timeout",
    r"ProcessGroupNCCL.*(?:[Tt]imeout|timed out)",
    r"NCCL communicator was aborted",
    r"NCCL error.*(?:unhandled system error|remote process exited|internal error|ncclRemoteError|ncclSystemError)",
    r"ncclRemoteError|ncclSystemError",
    r"NET/(?:IB|Socket).*(?:[Cc]onnection (?:reset|refused|closed)|Got completion .*error)",
    r"[Cc]onnection reset by peer",
    r"[Cc]onnection closed by peer",
    r"uncorrectable ECC error",
    r"\bXid\b.{0,40}\b(?:48|63|64|74|79|92|94|95|119|120)\b",
    r"CUDA error: (?:an illegal memory access.*ECC|uncorrectable|unspecified launch failure.*Xid)",
    r"GPU has fallen off the bus",
    r"RendezvousTimeoutError|RendezvousConnectionError",
)
# The subset that says a peer went away: on their own they point at someone else's failure.
PEER_LOSS_PATTERN = re.compile(rf"{PEER_LOSS_WORDS}|ncclRemoteError")


def evidence_regex(extra: str | None = None) -> re.Pattern[str]:
    """The compiled node-fault evidence, with the user's extra pattern OR-ed in."""
    patterns = list(NODE_FAULT_PATTERNS)
    if extra:
        patterns.append(extra)
    return re.compile("|".join(f"(?:{p})" for p in patterns))


class LauncherError(Exception):
    """A failure the launcher itself met, already classified: its reason, which gives its exit
    code. Every error the launcher raises for a known cause is one (the initializers' storage
    errors included), so turning it into an outcome goes by its type, never by guessing."""

    reason: Reason = Reasons.CONFIG_ERROR

    @property
    def exit_code(self) -> int:
        return self.reason.exit_code()

    def outcome(self, message: str | None = None) -> Outcome:
        """Its outcome; ``message``: said instead of the error's own text (with more context)."""
        return Outcome.of(self.reason, str(self) if message is None else message)


class ConfigError(LauncherError):
    """Bad input: one line naming the variable or argument, its value and what was expected."""

    def __init__(self, name: str, value: object, expected: str, *, secret: bool = False):
        self.name, self.value, self.expected = name, value, expected
        shown = f"{name} is unset" if value is None else f"{name}={'***' if secret else repr(value)}"
        super().__init__(f"{shown}: expected {expected}")


class UnsupportedVersion(LauncherError):
    """A framework (or Python) outside the supported range (launcher.core.versions), refused at
    start rather than left to fail mid-job."""

    reason = Reasons.UNSUPPORTED_VERSION


class WaitTimeout(LauncherError):
    """A name or port the job needs never came up before the deadline."""

    reason = Reasons.RENDEZVOUS_TIMEOUT


@dataclass(frozen=True)
class RootCause:
    node: str | None = None
    rank: int | None = None
    local_rank: int | None = None
    exit_code: int | None = None
    signal: str | None = None

    def to_json(self) -> dict:
        return {
            "node": self.node,
            "rank": self.rank,
            "localRank": self.local_rank,
            "exitCode": self.exit_code,
            "signal": self.signal,
        }

    @classmethod
    def from_json(cls, data: dict) -> RootCause:
        return cls(
            node=data.get("node"),
            rank=data.get("rank"),
            local_rank=data.get("localRank"),
            exit_code=data.get("exitCode"),
            signal=data.get("signal"),
        )


@dataclass(frozen=True)
class Outcome:
    """How a run ended. It holds no retryable flag: that follows from ``exit_code`` and the
    retryable set at delivery (:func:`is_retryable`). Made with :meth:`of`, never directly."""

    exit_code: int
    reason: str  # a Reason of the table; read back from another launcher, perhaps one it lacks
    message: str
    root_cause: RootCause | None = None
    evidence: str | None = None
    extra: dict = field(default_factory=dict)
    said: bool = field(default=False, compare=False)  # a nested launcher already logged it

    @classmethod
    def of(
        cls,
        reason: Reason,
        message: str,
        root_cause: RootCause | None = None,
        evidence: str | None = None,
        extra: dict | None = None,
        *,
        exit_code: int | None = None,
    ) -> Outcome:
        """The one way an outcome is made: the reason gives the exit code, or, where its rule
        does (the program's code, 128+signal, the root cause's), checks nothing and takes
        ``exit_code``."""
        return cls(reason.exit_code(exit_code), reason, message, root_cause, evidence, dict(extra or {}))

    def to_json(self, retryable_codes: frozenset[int]) -> dict:
        data: dict = {
            "retryable": is_retryable(self.exit_code, retryable_codes),
            "exitCode": self.exit_code,
            "reason": self.reason,
            "message": self.message,
        }
        if self.root_cause is not None:
            data["rootCause"] = self.root_cause.to_json()
        if self.evidence:
            data["evidence"] = self.evidence
        data.update(self.extra)
        return data

    @classmethod
    def from_json(cls, data: dict) -> Outcome:
        """A termination message read back (``local`` reads each node's). Its ``retryable`` is
        dropped: the reader decides it again from the exit code and its own retryable set."""
        known = {"retryable", "exitCode", "reason", "message", "rootCause", "evidence"}
        root = data.get("rootCause")
        reason = str(data["reason"])
        return cls(
            exit_code=int(data["exitCode"]),  # as it was given: the pod that made it applied the table
            reason=Reasons.named(reason) or reason,
            message=str(data.get("message", "")),
            root_cause=RootCause.from_json(root) if isinstance(root, dict) else None,
            evidence=data.get("evidence"),
            extra={k: v for k, v in data.items() if k not in known},
        )

    def with_extra(self, **extra) -> Outcome:
        return replace(self, extra={**self.extra, **extra})

    def on_node(self, node: str) -> Outcome:
        """Name the node as the root cause when nothing more precise is known."""
        return self if self.root_cause is not None else replace(self, root_cause=RootCause(node=node))

    def termination_message(self, retryable_codes: frozenset[int], limit: int = 4096) -> str:
        """The JSON for /dev/termination-log, shortened to fit Kubernetes' 4096 bytes."""
        outcome = self
        text = json.dumps(outcome.to_json(retryable_codes), separators=(",", ":"))
        budget = 1024
        while len(text.encode()) > limit and budget >= 16:
            outcome = replace(
                outcome,
                message=_shorten(self.message, budget),
                evidence=_shorten(self.evidence, budget // 2) if self.evidence else None,
                extra={},
            )
            text = json.dumps(outcome.to_json(retryable_codes), separators=(",", ":"))
            budget //= 2
        return text


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"SIG{signum}"


def code_for(returncode: int) -> int:
    """A Popen-style return code (negative for a signal) as a shell would report it."""
    return 128 - returncode if returncode < 0 else returncode


class RankEnding(Protocol):
    """How a failing rank ended, in its own word: a rank's report or a stop record
    (launcher/runner/report.py)."""

    @property
    def node(self) -> str | None: ...
    @property
    def rank(self) -> int | None: ...
    @property
    def local_rank(self) -> int | None: ...
    @property
    def exit_code(self) -> int | None: ...
    @property
    def signal(self) -> str | None: ...
    @property
    def returncode(self) -> int | None: ...


def rank_verdict(ending: RankEnding, codes: frozenset[int]) -> Outcome:
    """The table's row for a rank's own word (its code, or its signal), naming the rank and its node."""
    cause = RootCause(
        node=ending.node,
        rank=ending.rank,
        local_rank=ending.local_rank,
        exit_code=ending.exit_code,
        signal=ending.signal,
    )
    what = f"rank {cause.rank} on {cause.node}" if cause.rank is not None else f"{cause.node}"
    return classify(ending.returncode or 1, retryable_codes=codes, root_cause=cause, what=what)


def classify(
    returncode: int,
    *,
    retryable_codes: frozenset[int] = DEFAULT_RETRYABLE_EXIT_CODES,
    evidence: str | None = None,
    root_cause: RootCause | None = None,
    what: str = "the command",
) -> Outcome:
    """The rows for a process's return code (negative: killed by that signal).

    | what happened                            | exit code  | reason        | retryable (default set) |
    | exited 0                                 | 0          | Succeeded     | -                       |
    | output shows a node/network fault        | 138        | NodeFault     | yes                     |
    | killed by SIGSEGV/SIGILL/SIGFPE/SIGBUS   | 128+signal | Crashed       | no                      |
    | code (or 128+signal) in the retryable set| that code  | RetryableExit | yes                     |
    |                                          |            | or Killed     |                         |
    | any other exit code or signal            | that code  | Failed or     | no                      |
    |                                          |            | Signaled      |                         |

    ``retryable_codes`` picks the reason only; retryable itself is :func:`is_retryable` of the
    exit code, at delivery. A crash whose code a user lists as retryable is retried, since the
    policy cannot tell it apart from a rank that exited with that code.
    """
    code = code_for(returncode)
    sig = -returncode if returncode < 0 else None
    how = f"was killed by {signal_name(sig)}" if sig else f"exited with code {code}"
    if code == SUCCESS:
        return Outcome.of(Reasons.SUCCEEDED, f"{what} succeeded", root_cause)
    if evidence:
        return Outcome.of(
            Reasons.NODE_FAULT, f"{what} {how}; its output shows a node or network fault", root_cause, evidence
        )
    if sig in CRASH_SIGNALS:
        reason = Reasons.CRASHED
    elif code in retryable_codes:
        reason = Reasons.KILLED if sig else Reasons.RETRYABLE_EXIT
    else:
        reason = Reasons.SIGNALED if sig else Reasons.FAILED
    return Outcome.of(reason, f"{what} {how}", root_cause, exit_code=code)


# What a native abort prints that tells nobody anything at a glance: C++ stack frames (c10's
# "frame #3: ..." and its header, absl's "@ 0x7f...") and blank lines.
_NATIVE_NOISE = re.compile(
    r"^\s*(?:frame #\d+: |@\s+0x[0-9a-f]+\s|Exception raised from .* \(most recent call first\):$|$)"
)
# The exception a C++ runtime aborted on: "terminate called after throwing an instance of 'X'"
# then "  what():  <its message>" (an NCCL watchdog on a CUDA error, for one).
_ABORTED_ON = re.compile(r"^\s*what\(\):\s+(.+)$")


def last_lines(lines: Iterable[str]) -> dict:
    """The ``lastLines`` of a failed child's outcome: the last lines it printed, as many as the
    termination message shows at a glance, less native stack frames; nothing when it printed
    nothing."""
    last = [line for line in lines if not _NATIVE_NOISE.match(line)][-LAST_LINES:]
    return {"lastLines": last} if last else {}


def aborted_on(lines: Iterable[str]) -> str | None:
    """The message of the C++ exception a process aborted on (SIGABRT), from its ``what():``
    line, when its output has one: the error a termination message should name."""
    found = None
    for line in lines:
        if match := _ABORTED_ON.match(line):
            found = match[1].strip()
    return _shorten(found, 500) if found else None


def internal_error(error: BaseException | str, where: str | None = None, node: str | None = None) -> Outcome:
    """The launcher's own crash, named as such: its version, the exception and the frame in the
    launcher it came from. ``error``: the exception, or its text as another process reported it."""
    from launcher import __version__

    if isinstance(error, BaseException):
        where = where or crash_site(error)
        error = describe(error)
    on = f" on {node}" if node else ""
    at = f" at {where}" if where else ""
    return Outcome.of(
        Reasons.LAUNCHER_ERROR,
        f"trainer-launcher {__version__} failed{on} (a bug in the launcher, not your program): "
        f"{_shorten(str(error), 500)}{at}",
        RootCause(node=node) if node else None,
    )


def terminated(signum: int) -> Outcome:
    """The launcher was asked to stop (pod deletion, Ctrl-C) and tore the job down: 128+signal."""
    return Outcome.of(
        Reasons.TERMINATED, f"the launcher received {signal_name(signum)} and stopped the job", exit_code=128 + signum
    )


def stopped(what: str, signum: int | None, holder: str) -> Outcome:
    """``what`` serves the job and was stopped (by ``signum``, else it left on its own): exit 0,
    neither a failure nor the job's success, which ``holder`` reports."""
    how = f"stopped by {signal_name(signum)}" if signum is not None else "stopped"
    return Outcome.of(Reasons.STOPPED, f"{what} {how}; {holder}")


def success() -> Outcome:
    return Outcome.of(Reasons.SUCCEEDED, "the job succeeded")


def stopped_by(root: Outcome, node: str) -> Outcome:
    """What a node that stopped because of ``root`` says: the root's exit code, cause and
    evidence, so every pod of the job reports the same failure; ``causeReason`` keeps the root's
    own reason (the TrainJob's status shows that one)."""
    cause = root.extra.get("causeReason", root.reason) if root.reason == Reasons.PEER_FAILED else root.reason
    # Everything of the root's (its code too: PeerFailed's rule) but the reason, the message, causeReason.
    return replace(
        root,
        reason=Reasons.PEER_FAILED,
        message=f"{root.message}; {node} stopped its ranks because of it",
        extra={**root.extra, "causeReason": cause},
    )
