"""The one exit-code table.

Everything that ends a launcher run (a rank's exit, a signal the launcher received, a wait
that timed out, bad configuration) becomes an :class:`Outcome` here and nowhere else.
Classification decides only the exit code. Whether that code is retryable is decided by one
function, :func:`is_retryable`, from the code and the retryable set, and only when the outcome is
delivered; the runtimes' failure policies (:mod:`launcher.core.failure_policy`) are derived from the
same set. So the exit code, ``retryable`` in the termination message and the policy cannot
disagree.
"""

from __future__ import annotations

import json
import re
import signal
from dataclasses import dataclass, field, replace

# INTERNAL_ERROR (70, sysexits' EX_SOFTWARE): a failure of the launcher itself, a bug in it, its
# torch agent or its runners (told apart by launcher.core.crash), never the code of the user's
# program. Permanent under the default set, on purpose: a launcher bug is deterministic for one
# image and environment, and a retry restarts the whole JobSet only to meet it again. The reason
# (LauncherError) and the code tell it apart from the program failing; whoever prefers a retry
# adds 70 to LAUNCHER_RETRYABLE_EXIT_CODES, and the runtimes' policy follows from the same set.
from launcher.core.crash import INTERNAL_ERROR, REASON as INTERNAL_REASON, crash_site, describe

SUCCESS = 0
CONFIG_ERROR = 2
COMMAND_NOT_FOUND = 127
# The launcher's own transient failures and ranks that show a node/network fault. Trainer v1
# reserved 138 (128 + SIGUSR1) for user-defined retryable errors; we use it the same way.
TRANSIENT = 138

DEFAULT_RETRYABLE_EXIT_CODES: frozenset[int] = frozenset({130, 137, 138, 143})
# Killed by these, a rank crashed on its own (permanent under the default set), unless its output
# shows a hardware fault.
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
PEER_LOSS_PATTERN = re.compile(
    r"[Cc]onnection (?:reset|closed) by peer|remote process exited|ncclRemoteError"
)


def is_retryable(exit_code: int, retryable_codes: frozenset[int]) -> bool:
    """The one decision: Kubernetes sees only the exit code, and the runtimes' podFailurePolicy
    fails the Job at once for every code outside ``{0} | retryable_codes``."""
    return exit_code != SUCCESS and exit_code in retryable_codes


def evidence_regex(extra: str | None = None) -> re.Pattern[str]:
    """The compiled node-fault evidence, with the user's extra pattern OR-ed in."""
    patterns = list(NODE_FAULT_PATTERNS)
    if extra:
        patterns.append(extra)
    return re.compile("|".join(f"(?:{p})" for p in patterns))


class LauncherError(Exception):
    """A failure of the launcher itself, already classified: its exit code and reason."""

    exit_code = CONFIG_ERROR
    reason = "ConfigError"

    def outcome(self) -> Outcome:
        return Outcome(exit_code=self.exit_code, reason=self.reason, message=str(self))


class ConfigError(LauncherError):
    """Bad input: one line naming the variable or argument, its value and what was expected."""

    def __init__(self, name: str, value: object, expected: str, *, secret: bool = False):
        self.name, self.value, self.expected = name, value, expected
        if value is None:
            shown = f"{name} is unset"
        else:
            shown = f"{name}={'***' if secret else repr(value)}"
        super().__init__(f"{shown}: expected {expected}")


class UnsupportedVersion(LauncherError):
    """A framework (or Python) outside the supported range (launcher.core.versions), refused at
    start rather than left to fail mid-job."""

    reason = "UnsupportedVersion"


class WaitTimeout(LauncherError):
    """A name or port the job needs never came up before the deadline."""

    exit_code = TRANSIENT
    reason = "RendezvousTimeout"


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
    retryable set at delivery (:func:`is_retryable`)."""

    exit_code: int
    reason: str
    message: str
    root_cause: RootCause | None = None
    evidence: str | None = None
    extra: dict = field(default_factory=dict)
    said: bool = field(default=False, compare=False)  # a nested launcher already logged it

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
        return cls(
            exit_code=int(data["exitCode"]),
            reason=str(data["reason"]),
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


def classify(
    returncode: int,
    *,
    retryable_codes: frozenset[int] = DEFAULT_RETRYABLE_EXIT_CODES,
    evidence: str | None = None,
    root_cause: RootCause | None = None,
    what: str = "the command",
) -> Outcome:
    """The table itself: a failed process's return code (negative: killed by that signal).

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
        return Outcome(SUCCESS, "Succeeded", f"{what} succeeded", root_cause)
    if evidence:
        return Outcome(
            TRANSIENT,
            "NodeFault",
            f"{what} {how}; its output shows a node or network fault",
            root_cause,
            evidence,
        )
    if sig in CRASH_SIGNALS:
        return Outcome(code, "Crashed", f"{what} {how}", root_cause)
    if code in retryable_codes:
        return Outcome(code, "Killed" if sig else "RetryableExit", f"{what} {how}", root_cause)
    return Outcome(code, "Signaled" if sig else "Failed", f"{what} {how}", root_cause)


def internal_error(error: BaseException | str, where: str | None = None, node: str | None = None) -> Outcome:
    """The launcher's own crash, named as such: its version, the exception and the frame in the
    launcher it came from. ``error``: the exception, or its text as another process reported it."""
    from launcher import __version__

    if isinstance(error, BaseException):
        where = where or crash_site(error)
        error = describe(error)
    on = f" on {node}" if node else ""
    at = f" at {where}" if where else ""
    return Outcome(INTERNAL_ERROR, INTERNAL_REASON,
                   f"trainer-launcher {__version__} failed{on} (a bug in the launcher, not your program): "
                   f"{_shorten(str(error), 500)}{at}", RootCause(node=node) if node else None)


def terminated(signum: int) -> Outcome:
    """The launcher was asked to stop (pod deletion, Ctrl-C) and tore the job down: 128+signal."""
    return Outcome(128 + signum, "Terminated", f"the launcher received {signal_name(signum)} and stopped the job")


def success() -> Outcome:
    return Outcome(SUCCESS, "Succeeded", "the job succeeded")
