"""The one table of reasons: every way a launcher run ends, each with its exit code.

A reason is a value, not a bare string: a :class:`Reason` is the name users see (in the
termination message, the log line, the TrainJob's final status), and it knows where its exit code
comes from: a code of its own, or a rule (the program's code, 128+signal, the root cause's code).
Whether a code is retryable is decided by :func:`is_retryable` alone, from the code and the
retryable set; the runtimes' failure policy (:mod:`launcher.core.failure_policy`) is derived from
the same set, so neither the table nor the policy holds a second answer.

Outcomes are made from these values in one place (:mod:`launcher.core.outcome`); every other
module names a reason as ``Reasons.PEER_LOST``, never as its string.

Stdlib only, and loadable by path: the frameworks' runners (their ``run.py``), which run in the
user's interpreter where ``launcher`` may not be importable, load this file as their siblings
(``launcher/core/crash.py`` does so too) and write ``Reasons.X`` into their reports.
"""

from __future__ import annotations

SUCCESS = 0
CONFIG_ERROR = 2
# sysexits' EX_SOFTWARE: a failure of the launcher itself, a bug in it, its agents or its
# runners (told apart by launcher.core.crash), never the code of the user's program. Permanent
# under the default set, on purpose: a launcher bug is deterministic for one image and
# environment, and a retry restarts the whole JobSet only to meet it again. The reason
# (LauncherError) and the code tell it apart from the program failing; whoever prefers a retry
# adds 70 to LAUNCHER_RETRYABLE_EXIT_CODES, and the runtimes' policy follows from the same set.
INTERNAL_ERROR = 70
NOT_EXECUTABLE = 126  # as a shell says
COMMAND_NOT_FOUND = 127
# The launcher's own transient failures and ranks that show a node/network fault. Trainer v1
# reserved 138 (128 + SIGUSR1) for user-defined retryable errors; we use it the same way.
TRANSIENT = 138

DEFAULT_RETRYABLE_EXIT_CODES: frozenset[int] = frozenset({130, 137, 138, 143})

# What every collective library's TCP transport says when the other end went away: a process that
# failed because of it was stopped by a peer (PeerFailed, PeerLost), it is not the root cause. Each
# framework adds its own library's words (core.outcome, the runners); this part is spelled once.
PEER_LOSS_WORDS = r"[Cc]onnection (?:reset|closed) by peer|remote process exited"


def is_retryable(exit_code: int, retryable_codes: frozenset[int]) -> bool:
    """The one decision: Kubernetes sees only the exit code, and the runtimes' podFailurePolicy
    fails the Job at once for every code outside ``{0} | retryable_codes``."""
    return exit_code != SUCCESS and exit_code in retryable_codes


# The rules for reasons whose exit code is not their own, and the codes each can give.
PROGRAM = "the program's own exit code"
SIGNAL = "128 + the signal that ended it"
CAUSE = "the exit code of the root cause it stopped for"
_RULE_CODES: dict[str, range] = {
    PROGRAM: range(1, 256),
    SIGNAL: range(128 + 1, 128 + 64 + 1),  # Linux signals 1..64 (SIGRTMAX)
    CAUSE: range(1, 256),
}


class Reason(str):
    """A reason's name, with its exit code or the rule that gives it.

    A ``str`` so that it is what users see wherever a string goes (JSON, log lines, f-strings)
    and equal to the same name read back from another pod's termination message."""

    code: int | None  # its own exit code; None where ``rule`` gives it
    rule: str | None  # PROGRAM, SIGNAL or CAUSE where the code is not its own

    def __new__(cls, name: str, code: int | None = None, rule: str | None = None) -> Reason:
        if (code is None) == (rule is None) or (rule is not None and rule not in _RULE_CODES):
            raise ValueError(f"{name}: a reason has its own exit code or one rule for it, not both or neither")
        self = super().__new__(cls, name)
        self.code, self.rule = code, rule
        return self

    def __getnewargs__(self) -> tuple:  # copy and pickle: str's own would drop the code
        return str(self), self.code, self.rule

    @property
    def codes(self) -> range:
        """Every exit code an outcome for this reason can carry."""
        if self.code is not None:
            return range(self.code, self.code + 1)
        if self.rule is None:  # __new__ refuses a reason with neither
            raise ValueError(f"{self}: a reason without an exit code or a rule")
        return _RULE_CODES[self.rule]

    def exit_code(self, given: int | None = None) -> int:
        """The exit code of an outcome for this reason: its own, or ``given`` where its rule gives
        the code. A code given for a reason that has its own is a bug in the caller."""
        if self.code is not None:
            if given is not None and given != self.code:
                raise ValueError(f"{self} exits {self.code}, not {given}")
            return self.code
        if given is None:
            raise ValueError(f"{self}: its exit code is {self.rule}; pass it")
        return given

    def retryable(
        self, retryable_codes: frozenset[int] = DEFAULT_RETRYABLE_EXIT_CODES, given: int | None = None
    ) -> bool:
        return is_retryable(self.exit_code(given), retryable_codes)


# The class body below looks a name up in itself first, where these three name reasons.
_CONFIG_ERROR, _COMMAND_NOT_FOUND, _NOT_EXECUTABLE = CONFIG_ERROR, COMMAND_NOT_FOUND, NOT_EXECUTABLE


class Reasons:
    """The table, enum-like: ``Reasons.PEER_LOST``; :meth:`all` lists them in this order."""

    # How a process ended (launcher.core.outcome.classify).
    SUCCEEDED = Reason("Succeeded", SUCCESS)
    FAILED = Reason("Failed", rule=PROGRAM)
    RETRYABLE_EXIT = Reason("RetryableExit", rule=PROGRAM)  # a code in the retryable set
    SIGNALED = Reason("Signaled", rule=SIGNAL)
    KILLED = Reason("Killed", rule=SIGNAL)  # 128+signal in the retryable set
    CRASHED = Reason("Crashed", rule=SIGNAL)  # SIGSEGV, SIGILL, SIGFPE, SIGBUS
    OUT_OF_MEMORY = Reason("OutOfMemory", rule=SIGNAL)  # SIGKILL, and the kernel counted an OOM kill
    NODE_FAULT = Reason("NodeFault", TRANSIENT)  # its output, or a preflight check, shows it
    # How a job ended around this pod.
    # A pod that only serves the job (a worker whose sshd another pod's launcher uses) was stopped,
    # as it is once the job has ended: its pod is done, and how the job ended is another pod's to say.
    STOPPED = Reason("Stopped", SUCCESS)
    TERMINATED = Reason("Terminated", rule=SIGNAL)  # the launcher was asked to stop
    PEER_FAILED = Reason("PeerFailed", rule=CAUSE)  # another pod failed first: its code
    PEER_LOST = Reason("PeerLost", TRANSIENT)  # another pod went away without a word
    HANG = Reason("Hang", TRANSIENT)
    RENDEZVOUS_TIMEOUT = Reason("RendezvousTimeout", TRANSIENT)
    RENDEZVOUS_FAILED = Reason("RendezvousFailed", TRANSIENT)
    # JobSet's in-place restart asked every pod to restart its container: the agent's exit code
    # (IN_PLACE_RESTART_EXIT_CODE, one of the retryable set).
    RESTART_ASKED = Reason("RestartAsked", rule=PROGRAM)
    # The launcher itself, and what it was given.
    LAUNCHER_ERROR = Reason("LauncherError", INTERNAL_ERROR)
    CONFIG_ERROR = Reason("ConfigError", _CONFIG_ERROR)
    UNSUPPORTED_VERSION = Reason("UnsupportedVersion", _CONFIG_ERROR)
    COMMAND_NOT_FOUND = Reason("CommandNotFound", _COMMAND_NOT_FOUND)
    NOT_EXECUTABLE = Reason("NotExecutable", _NOT_EXECUTABLE)
    HOST_KEY_MISMATCH = Reason("HostKeyMismatch", _CONFIG_ERROR)
    DUPLICATE_PROCESS_ID = Reason("DuplicateProcessId", _CONFIG_ERROR)
    MISCONFIGURED = Reason("Misconfigured", _CONFIG_ERROR)  # a preflight check of the configuration
    # The initializers: storage that may heal on another try, ...
    STORAGE_UNAVAILABLE = Reason("StorageUnavailable", TRANSIENT)
    LEASE_TIMEOUT = Reason("LeaseTimeout", TRANSIENT)
    LEASE_LOST = Reason("LeaseLost", TRANSIENT)
    LOCAL_IO_ERROR = Reason("LocalIOError", TRANSIENT)
    # ... and what no retry fixes.
    STORAGE_ERROR = Reason("StorageError", _CONFIG_ERROR)
    NOT_FOUND = Reason("NotFound", _CONFIG_ERROR)
    AUTH_FAILED = Reason("AuthFailed", _CONFIG_ERROR)
    BAD_REQUEST = Reason("BadRequest", _CONFIG_ERROR)
    NO_CREDENTIALS = Reason("NoCredentials", _CONFIG_ERROR)
    UNSAFE_PATH = Reason("UnsafePath", _CONFIG_ERROR)
    PATH_CLASH = Reason("PathClash", _CONFIG_ERROR)
    BAD_ARCHIVE = Reason("BadArchive", _CONFIG_ERROR)
    PERMISSION_DENIED = Reason("PermissionDenied", _CONFIG_ERROR)
    READ_ONLY_FILE_SYSTEM = Reason("ReadOnlyFileSystem", _CONFIG_ERROR)
    NO_SPACE = Reason("NoSpace", _CONFIG_ERROR)
    BAD_PATH = Reason("BadPath", _CONFIG_ERROR)
    # The export after the job (EXPORT_URI): the storage's own reason (one above) in exportCause.
    EXPORT_FAILED = Reason("ExportFailed", TRANSIENT)  # storage that may heal on another try
    EXPORT_REJECTED = Reason("ExportRejected", _CONFIG_ERROR)  # what no retry fixes

    @classmethod
    def all(cls) -> tuple[Reason, ...]:
        return tuple(value for value in vars(cls).values() if isinstance(value, Reason))

    @classmethod
    def named(cls, name: str) -> Reason | None:
        """The table's reason of that name (one read back from a termination message), or None."""
        return _BY_NAME.get(name)


_BY_NAME: dict[str, Reason] = {reason: reason for reason in Reasons.all()}
if len(_BY_NAME) != len(Reasons.all()):  # two entries of one name would be one reason, two codes
    raise ImportError("launcher.core.reasons: a reason name is in the table twice")
