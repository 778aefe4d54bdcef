"""``python run.py [--go-fd FD] [--joined-fd FD] [--report PATH] [--] SCRIPT|-m MODULE|-c CODE [ARGS...]``:
one XGBoost worker under ``trainer-launcher xgboost``.

It joins the job's collective from the ``DMLC_*`` variables, then runs the program as ``python``
would have, inside that collective, so a program that never mentions the collective trains
distributed (``xgboost.train`` and ``QuantileDMatrix`` just work). In detail:

- ``xgboost.collective.CommunicatorContext(dmlc_tracker_uri=DMLC_TRACKER_URI,
  dmlc_tracker_port=DMLC_TRACKER_PORT, dmlc_task_id=DMLC_TASK_ID)`` is entered before the program
  and left after it. The task id is zero-padded to the width of the largest one: the tracker
  sorts task ids as strings, and padded, rank == task id even beyond 10 workers.
- While the program runs, its own set-up joins that collective instead of building a second one
  (xgboost 3 cannot nest them): ``CommunicatorContext(...)`` and ``collective.init(...)`` with no
  arguments or with the same tracker and task id do nothing, ``collective.finalize()`` does nothing
  (the runner finalizes), and a ``RabitTracker`` on ``DMLC_TRACKER_PORT`` stands for the tracker the
  launcher already runs on pod 0 (``start`` and ``wait_for`` do nothing). So upstream's example
  runs unchanged. Asking for another tracker or task id is an error; ``dmlc_retry`` and
  ``dmlc_timeout`` are reported as not applied.
- The launcher's go word (on the pipe ``--go-fd``) comes once the tracker listens; the import of
  xgboost happens before it. A runner the launcher started before planning gets its DMLC_* values
  in that word. A pipe closed without the word (the launcher stopped first, or planned otherwise)
  ends the runner at once, silently, exit 0.
- Joined, it writes its task id to the pipe ``--joined-fd``, so the launcher can time out a job
  whose workers never all arrive.
- Before ``import xgboost`` it checks the installed version against the supported range
  (launcher/core/versions.py): outside it, after the go word, one line and exit 2 (its report's
  reason UnsupportedVersion), unless LAUNCHER_ALLOW_UNTESTED_VERSIONS=1 (one warning line).
- A failing program exits with its own status at once, without the collective's shutdown, after
  writing its report (launcher/runner/report.py) to the file ``--report``: ending ``failed``, or
  ``peerLost`` where the error is a lost peer (a tracker it could not join too), its task id as
  ``rank``, exit code and error in a line. The launcher names the worker from it. The version gate
  reports ``refused`` (reason UnsupportedVersion), the runner's own bug ``crashed``.

Run by path, not as ``-m launcher.xgboost.run``, so any interpreter that has xgboost can run it:
it imports nothing but the standard library and xgboost, and stdlib-only files of the launcher
loaded by path: ../runner/program.py, which runs the program exactly as python would;
../runner/report.py, the report every runner writes; compat.py,
through which every use of xgboost's internals goes; ../core/versions.py, ../core/crash.py and
../core/reasons.py. It reads its few variables itself (the launcher has validated them
already; run by hand, a bad value is one line and exit 2).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from typing import TYPE_CHECKING, NoReturn  # the runner (program.py) imports typing anyway

# The launcher's options, before the program: pipes it passes, where to report.
OPTIONS = ("--go-fd", "--joined-fd", "--report")
GO_WORD = b"go\n"
JOIN_FAILED = 138  # the launcher's transient exit code: a tracker that could not be joined
ERROR_LIMIT = 1000
# "- [allreduce.cc:135|14:36:09]: Ring Allreduce failed.": one cause of an XGBoostError.
_XGBOOST_CAUSE = re.compile(r"^\s*-\s*\[[^\]]*\]:\s*(.*?)\s*$")
_TIME_STAMP = re.compile(r"^\[\d\d:\d\d:\d\d\]\s*")


# The runner every framework shares (launcher/runner/program.py), loaded by path: it runs the program
# exactly as python would, and loads the launcher's other stdlib-only files the same way.
if TYPE_CHECKING:  # the same file, as a type checker finds it
    from launcher.runner import program
else:  # through the one loader beside it (launcher/runner/_trainer_launcher_load.py)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "runner"))
    from _trainer_launcher_load import program

    del sys.path[0]


# The report every runner gives its launcher (launcher/runner/report.py).
records = program.records()
# Every use of xgboost's internals, behind feature checks (launcher/xgboost/compat.py).
compat = program.load_sibling(__file__, "compat.py", "_trainer_launcher_xgboost_compat")
# The runner's own bug told apart from the program's failure (launcher/core/crash.py).
crash = program.core("crash")
# The supported ranges (launcher/core/versions.py), checked before the framework is imported.
versions = program.core("versions")
# The table of reasons (launcher/core/reasons.py): the report's reason for an xgboost out of range.
reasons = program.core("reasons")
UNSUPPORTED = reasons.Reasons.UNSUPPORTED_VERSION
CONFIG_ERROR = reasons.Reasons.CONFIG_ERROR
# What xgboost's collective says when the other end of a connection went away: a worker that died
# (or was torn down) elsewhere, or the tracker; beside the words every library's transport says.
PEER_LOSS = re.compile(
    rf"{reasons.PEER_LOSS_WORDS}|The other end is likely closed|"
    r"Ring (?:Allreduce|scatter reduce|allgather) failed|Failed to connect to the tracker|"
    r"Broken pipe|Socket closed"
)


def _say(message: str) -> None:
    print(f"trainer-launcher: xgboost: {message}", file=sys.stderr, flush=True)


def _usage_error(message: str) -> NoReturn:
    _say(message)
    sys.exit(2)


def error_line(error: BaseException) -> str:
    """An XGBoostError in one line: its ``- [file:line|time]: what`` causes, innermost last,
    without source paths, time stamps and the native stack trace."""
    lines = str(error).splitlines()
    causes = [match[1] for line in lines if (match := _XGBOOST_CAUSE.match(line)) and match[1]]
    if not causes:
        first = next((line.strip() for line in lines if line.strip()), type(error).__name__)
        causes = [_TIME_STAMP.sub("", first)]
    return "; ".join(causes)[:ERROR_LIMIT]


# --- which xgboost ------------------------------------------------------------------------------


def check_version(version: str | None = None, environ: dict[str, str] | None = None) -> str | None:
    """The installed xgboost (or ``version``) against the range the launcher supports, read without
    importing xgboost: the one line that refuses it, or None (allowed out of range: one warning)."""
    return versions.runner_refusal("xgboost", _say, version, environ)


def version_gate(go_fd: int | None, report_path: str | None, version: str | None = None) -> int | None:
    """Refuse an xgboost out of range (exit 2, one line, the report's reason UnsupportedVersion),
    after the go word: a runner the launcher sends away leaves quietly. Returns the go pipe still
    to be read: ``go_fd``, or None once the word was read here."""
    if check_version(version) is None:
        return go_fd
    os.environ.update(wait_for_go(go_fd))
    refused = check_version(version)  # the go word may carry LAUNCHER_ALLOW_UNTESTED_VERSIONS
    if refused is not None:
        task_id = WorkerEnv(dict(os.environ)).task_id
        report(report_path, "refused", 2, task_id, error=refused, reason=UNSUPPORTED)
        _usage_error(refused)
    return None


def cannot_import(go_fd: int | None, report_path: str | None, error: Exception) -> NoReturn:
    """The program's interpreter has no xgboost that imports: the image's, not the launcher's, fault
    (exit 2, one line, the report's reason ConfigError), after the go word."""
    if go_fd is not None:
        os.environ.update(wait_for_go(go_fd))
    line = f"{sys.executable} cannot import xgboost: {program.describe(error)}"
    report(report_path, "refused", 2, WorkerEnv(dict(os.environ)).task_id, error=line, reason=CONFIG_ERROR)
    _usage_error(line)


# --- what to run ----------------------------------------------------------------------------


def parse_options(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """The launcher's leading ``--go-fd N --joined-fd N --report PATH``, and the rest."""
    options: dict[str, str] = {}
    while len(argv) >= 2 and argv[0] in OPTIONS:
        options[argv[0]], argv = argv[1], argv[2:]
    return options, argv


def parse_target(argv: list[str]) -> tuple[str, str, list[str]]:
    """(kind, target, args), as launcher/core/python_argv.py wrote them after the options."""
    try:
        return program.parse_target(argv)
    except ValueError as usage:
        _usage_error(str(usage))


# --- the job's collective ---------------------------------------------------------------------


class WorkerEnv:
    """The DMLC_* values this worker joins with (validated by the launcher; by hand, here)."""

    def __init__(self, environ: dict[str, str]):
        self.tracker_uri = environ.get("DMLC_TRACKER_URI") or "127.0.0.1"
        self.tracker_port = self._int(environ, "DMLC_TRACKER_PORT", 1, 65535, "a port from 1 to 65535")
        self.num_worker = self._int(environ, "DMLC_NUM_WORKER", 1, None, "a worker count, 1 or more")
        self.task_id = self._int(
            environ,
            "DMLC_TASK_ID",
            0,
            self.num_worker - 1,
            f"a task id from 0 to {self.num_worker - 1} (DMLC_NUM_WORKER={self.num_worker})",
        )

    @staticmethod
    def _int(environ: dict[str, str], name: str, low: int, high: int | None, expected: str) -> int:
        raw = environ.get(name)
        if raw is None or raw == "":
            _usage_error(f"{name} is unset: expected {expected}")
        text = raw.strip()
        if not text.isdigit() or int(text) < low or (high is not None and int(text) > high):
            _usage_error(f"{name}={raw!r}: expected {expected}")
        return int(text)

    @property
    def padded_task_id(self) -> str:
        return str(self.task_id).zfill(len(str(self.num_worker - 1)))

    def args(self) -> dict:
        return {
            "dmlc_tracker_uri": self.tracker_uri,
            "dmlc_tracker_port": self.tracker_port,
            "dmlc_task_id": self.padded_task_id,
        }


def _same(key: str, given, ours) -> bool:
    if key == "dmlc_tracker_uri":
        return str(given).strip() == str(ours)
    text = str(given).strip()
    return text.isdigit() and int(text) == int(ours)


class JoinedCollective:
    """While the program runs: its own collective set-up joins the runner's (see the module doc).
    What it replaces in xgboost is replaced through launcher/xgboost/compat.py."""

    _CHECKED = ("dmlc_tracker_uri", "dmlc_tracker_port", "dmlc_task_id")
    _NOT_APPLIED = ("dmlc_retry", "dmlc_timeout")

    def __init__(self, worker: WorkerEnv, collective, tracker_module, package):
        self.worker, self.collective, self.tracker_module, self.package = worker, collective, tracker_module, package
        self.warned: set[str] = set()
        self._restore: list = []

    def install(self) -> None:
        self._restore = [
            compat.join_collective(self.collective, self.init, self.finalize),
            compat.stand_in_tracker(
                self.package, self.tracker_module, self.worker.tracker_port, self.worker.num_worker, self.worker.args
            ),
        ]

    def uninstall(self) -> None:
        for restore in reversed(self._restore):
            restore()
        self._restore = []

    def init(self, **args) -> None:
        ours = self.worker.args()
        conflicts = [
            f"{key}={args[key]!r}"
            for key in self._CHECKED
            if args.get(key) is not None and not _same(key, args[key], ours[key])
        ]
        if args.get("dmlc_communicator") not in (None, "rabit"):
            conflicts.append(f"dmlc_communicator={args['dmlc_communicator']!r}")
        if conflicts:
            raise ValueError(
                f"trainer-launcher joined this worker to the tracker {self.worker.tracker_uri}:"
                f"{self.worker.tracker_port} as task {self.worker.task_id} before the program started; "
                f"the program asks for {', '.join(conflicts)}. Pass the DMLC_* values (or nothing), or set "
                "LAUNCHER_XGBOOST_TRACKER=program to run the collective yourself"
            )
        for key in self._NOT_APPLIED:
            if args.get(key) is not None and key not in self.warned:
                self.warned.add(key)
                _say(
                    f"{key}={args[key]!r} is not applied: the worker joined the collective before the "
                    "program (LAUNCHER_XGBOOST_TRACKER=program runs the collective yourself)"
                )

    def finalize(self) -> None:
        """The runner finalizes once the program is done."""


# --- the launcher's pipes -----------------------------------------------------------------------


def _fd(options: dict[str, str], name: str) -> int | None:
    value = options.get(name, "")
    return int(value) if value.isdigit() else None


def _read_exactly(fd: int, size: int) -> bytes:
    received = b""
    while len(received) < size:
        chunk = os.read(fd, size - len(received))
        if not chunk:
            os._exit(0)  # the launcher stopped first: nothing to say, nothing to run
        received += chunk
    return received


def wait_for_go(fd: int | None) -> dict[str, str]:
    """Block until the launcher's go word; return the variables it adds. The word is ``go`` on a
    pipe the pod's workers share (each reads exactly its three bytes), or one JSON line
    ``{"env": {...}}`` on a runner's own pipe: a runner started before the launcher had planned
    learns its task id so. A pipe closed without a word ends the runner at once, exit 0."""
    if fd is None:
        return {}
    word = _read_exactly(fd, len(GO_WORD))
    if word != GO_WORD:
        while not word.endswith(b"\n"):
            word += _read_exactly(fd, 1)
    os.close(fd)
    return {} if word == GO_WORD else dict(json.loads(word)["env"])


def tell_joined(fd: int | None, task_id: int) -> None:
    if fd is None:
        return
    with contextlib.suppress(OSError):  # the launcher is gone; its children die with it
        os.write(fd, f"{task_id}\n".encode())
    os.close(fd)


def report(path: str | None, ending: str, status: int, task_id: int | None, **fields: str | None) -> None:
    """This worker's report to the launcher (launcher/runner/report.py), its task id as the rank:
    written whole or not at all. Unwritten, the launcher judges from the exit code alone."""
    records.write(path, records.report(ending, status, rank=task_id, **fields))


# --- running the program ----------------------------------------------------------------------


def describe(error: BaseException | None) -> str | None:
    if error is not None and type(error).__name__ == "XGBoostError":
        return f"XGBoostError: {error_line(error)}"
    return program.describe(error)


def main(argv: list[str] | None = None) -> None:
    options, rest = parse_options(sys.argv[1:] if argv is None else argv)
    kind, target, args = parse_target(rest)
    go_fd, joined_fd, report_path = _fd(options, "--go-fd"), _fd(options, "--joined-fd"), options.get("--report")
    if go_fd is None:  # by hand: refuse bad variables before the slow import
        WorkerEnv(dict(os.environ))
    program.set_sys_path(kind, target, os.path.dirname(os.path.realpath(__file__)))
    go_fd = version_gate(go_fd, report_path)  # before the import: an xgboost out of range never loads

    try:
        import xgboost
        from xgboost import collective, tracker
    except Exception as error:  # noqa: BLE001 - not installed in this interpreter, or a broken install
        cannot_import(go_fd, report_path, error)

    os.environ.update(wait_for_go(go_fd))
    program.register_stacks()
    worker = WorkerEnv(dict(os.environ))
    try:
        collective.CommunicatorContext(**worker.args()).__enter__()
    except Exception as error:  # noqa: BLE001 - XGBoostError, or a refused address
        _say(
            f"task {worker.task_id} could not join the tracker at {worker.tracker_uri}:{worker.tracker_port}: "
            f"{error_line(error)}"
        )
        said = f"could not join the tracker: {error_line(error)}"
        report(report_path, "peerLost", JOIN_FAILED, worker.task_id, error=said)  # the tracker, or its host, is gone
        program.leave(JOIN_FAILED)
    tell_joined(joined_fd, worker.task_id)
    joined = JoinedCollective(worker, collective, tracker, xgboost)
    joined.install()
    ending = program.run_program(kind, target, args)
    joined.uninstall()
    if ending.status != 0:  # leave without the collective's shutdown: it would wait on peers
        peer_lost = ending.error is not None and bool(PEER_LOSS.search(str(ending.error)))
        ended = "peerLost" if peer_lost else "failed"
        report(report_path, ended, ending.status, worker.task_id, error=describe(ending.error))
        program.leave(ending.status, interrupted=ending.interrupted)
    try:
        collective.finalize()
    except Exception as error:  # noqa: BLE001 - the program's work is done; say it and succeed
        _say(
            f"task {worker.task_id}: the collective's shutdown failed after the program succeeded: {error_line(error)}"
        )
    sys.exit(0)


def crashed(error: BaseException) -> None:
    """This runner's own bug (the program's failures never get here: run_program catches them):
    its traceback, then a report (ending ``crashed``) the launcher turns into LauncherError, exit 70."""
    import traceback

    traceback.print_exception(error)
    path = parse_options(sys.argv[1:])[0].get("--report")
    task = os.environ.get("DMLC_TASK_ID", "").strip()  # unknown before the go word of an early runner
    task_id = int(task) if task.isdigit() else None
    report(path, "crashed", crash.INTERNAL_ERROR, task_id, error=crash.describe(error), where=crash.crash_site(error))
    program.leave(crash.INTERNAL_ERROR)


if __name__ == "__main__":
    try:
        main()
    except Exception as error:  # xgboost's own errors and the program's go on as before
        if not crash.raised_in_launcher(error):
            raise
        crashed(error)
