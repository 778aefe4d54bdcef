"""``python run.py [--go-fd N] [--] SCRIPT|-m MODULE|-c CODE [ARGS...]``: a JAX process under ``trainer-launcher jax``.

It calls ``jax.distributed.initialize()`` from the ``JAX_*`` variables Trainer injects, then runs the
program as ``python`` would have. Upstream scripts pass the three values by hand, since a bare
``jax.distributed.initialize()`` outside Slurm, Open MPI or a TPU VM fails ("Number of processes
must be defined"); here both spellings work: the program's own call, with no arguments or with the
same values, does nothing. A call that asks for another process id or count is an error.

When a process's program fails, JAX alone would keep it in its shutdown barrier (300 s by
default) and the others in their next collective, until every process aborts with SIGABRT and
the real exit code is lost. Through the coordination service's key-value store instead:

- the failing process publishes the job's stop record (launcher/runner/report.py: its process
  id, pod, exit code, error; the first writer wins) and exits with its own code at once, without
  JAX's shutdown barrier;
- every other process watches for that record and exits with the same code, handing its
  launcher the record, so every pod names the same root cause;
- a process that failed only because a peer vanished ("Connection reset by peer") does not claim
  to be the root cause;
- process 0 serves the store, so it leaves last: after the others have read the record, or
  ``LINGER`` seconds.

A successful run ends with a barrier of its own, watched the same way, before JAX's.

Before ``import jax`` it checks the installed version against the supported range
(launcher/core/versions.py): outside it, after the go word, one line and exit 2 (reported as
UnsupportedVersion), unless LAUNCHER_ALLOW_UNTESTED_VERSIONS=1 (one warning line).

Run by path, not as ``-m launcher.jax.run``, so any interpreter that has jax can run it: it imports
nothing but the standard library and jax, and stdlib-only files of the launcher loaded by path:
../runner/program.py, which runs the program exactly as python would; compat.py, through which
every use of jax's internals goes; ../core/versions.py and ../core/crash.py. It reads its few
variables itself (the launcher has validated them already; run by hand, a bad value is one line
and exit 2).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import sys
import threading
import time
from typing import TYPE_CHECKING, NoReturn  # the runner (program.py) imports typing anyway

INIT_TIMEOUT_ENV = "TRAINER_LAUNCHER_JAX_INIT_TIMEOUT"
REPORT_ENV = "TRAINER_LAUNCHER_JAX_REPORT"
CPU_COLLECTIVES_ENV = "JAX_CPU_COLLECTIVES_IMPLEMENTATION"

PREFIX = "trainer-launcher/"
# Which start in place of the job this is (launcher.core.lifecycle.restart_env): its stop record's key.
RESTART_COUNT_ENV = "LAUNCHER_RESTART_COUNT"
DONE = json.dumps({"done": True})  # the stop key's value once the job succeeded: wakes every watcher
ACK_PREFIX = PREFIX + "ack/"
FINISHED_BARRIER = PREFIX + "finished"
WATCH_MS = 1000  # a watcher's long poll: how soon it notices it should stop watching
LINGER = 5.0  # process 0: how long it keeps the store up for the others to read the stop record
PEER_WAIT = 2.0  # a process that lost a peer: how long it looks for that peer's stop record
FINISH_TIMEOUT_MS = 7 * 24 * 3600 * 1000  # JAX's heartbeats end a barrier that a dead peer never joins
INIT_FAILED = 138  # the launcher's transient exit code: a coordinator that could not be joined


def _say(message: str) -> None:
    print(f"trainer-launcher: jax: {message}", file=sys.stderr, flush=True)


# The runner every framework shares (launcher/runner/program.py), loaded by path: it runs the program
# exactly as python would, and loads the launcher's other stdlib-only files the same way.
if TYPE_CHECKING:  # the same files, as a type checker finds them
    from launcher.jax.compat import Store
    from launcher.runner import program
    from launcher.runner import report as records
else:  # through the one loader beside it (launcher/runner/_trainer_launcher_load.py)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "runner"))
    from _trainer_launcher_load import program

    del sys.path[0]


# The report to the launcher and the job's stop record (launcher/runner/report.py).
records = program.records()
# Every use of jax's internals, behind feature checks (launcher/jax/compat.py).
compat = program.load_sibling(__file__, "compat.py", "_trainer_launcher_jax_compat")
# The runner's own bug told apart from the program's failure (launcher/core/crash.py).
crash = program.core("crash")
# The supported ranges (launcher/core/versions.py), checked before the framework is imported.
versions = program.core("versions")
# The errors of a collective whose peer went away (gloo's TCP pairs), in the table of reasons' words.
reasons = program.core("reasons")
PEER_LOSS = re.compile(rf"{reasons.PEER_LOSS_WORDS}|Socket closed")


def _usage_error(message: str) -> NoReturn:
    _say(message)
    sys.exit(2)


# --- what to run ----------------------------------------------------------------------------


def parse_target(argv: list[str]) -> tuple[str, str, list[str]]:
    """(kind, target, args), as launcher/core/python_argv.py wrote them after this file."""
    try:
        return program.parse_target(argv)
    except ValueError as usage:
        _usage_error(str(usage))


# --- which jax ------------------------------------------------------------------------------------


def check_version(version: str | None = None, environ: dict[str, str] | None = None) -> str | None:
    """The installed jax (or ``version``) against the range the launcher supports, read without
    importing jax: the one line that refuses it, or None (allowed out of range: one warning)."""
    return versions.runner_refusal("jax", _say, version, environ)


def version_gate(config: Config, version: str | None = None) -> None:
    """Refuse a jax out of range: report it (``refused``, UnsupportedVersion), one line, exit 2."""
    refused = check_version(version)
    if refused is not None:
        report(config, "refused", 2, reason=reasons.Reasons.UNSUPPORTED_VERSION, error=refused)
        _usage_error(refused)


# --- the launcher's side ----------------------------------------------------------------------


class Config:
    """The validated JAX_* values, read again here (see the module docstring)."""

    def __init__(self, environ: dict[str, str]):
        self.coordinator = environ.get("JAX_COORDINATOR_ADDRESS", "").strip() or None
        self.num_processes = self._int(environ, "JAX_NUM_PROCESSES", "1", 1)
        self.process_id = self._int(environ, "JAX_PROCESS_ID", environ.get("JOB_COMPLETION_INDEX") or "0", 0)
        self.init_timeout = self._int(environ, INIT_TIMEOUT_ENV, "300", 1)
        self.generation = self._int(environ, RESTART_COUNT_ENV, "0", 0)
        self.stop_key = records.stop_key(self.generation)
        self.report_path = environ.get(REPORT_ENV) or None
        self.node = environ.get("HOSTNAME") or socket.gethostname()
        if self.process_id >= self.num_processes:
            _usage_error(
                f"JAX_PROCESS_ID={self.process_id!r}: expected a process id from 0 to "
                f"{self.num_processes - 1} (JAX_NUM_PROCESSES={self.num_processes})"
            )
        if self.coordinator is None and self.num_processes > 1:
            _usage_error("JAX_COORDINATOR_ADDRESS is unset: expected HOST:PORT of process 0's coordinator")

    @staticmethod
    def _int(environ: dict[str, str], name: str, default: str, low: int) -> int:
        raw = environ.get(name, "").strip() or default
        if not raw.isdigit() or int(raw) < low:
            _usage_error(f"{name}={raw!r}: expected an integer of at least {low}")
        return int(raw)


def report(config: Config, ending: str, exit_code: int | None, **fields: object) -> None:
    """Tell the launcher how this process ended (launcher/runner/report.py). Unwritten, the
    launcher judges from the exit code."""
    record = records.report(ending, exit_code, rank=config.process_id, node=config.node, **fields)
    records.write(config.report_path, record)


class Go:
    """The launcher starts us first thing, so ``import jax`` overlaps its validation and its wait
    for the coordinator; we go on once it says so: one JSON line on the ``--go-fd`` pipe, with
    the variables to add. End of file without a word: the launcher will not need us (bad input,
    a signal, a plan without us), so we leave at once and say nothing, even mid-import."""

    def __init__(self, fd: int | None):
        self.word: dict = {}
        self._said = threading.Event()
        if fd is None:
            self._said.set()
        else:
            threading.Thread(target=self._listen, args=(fd,), name="trainer-launcher-go", daemon=True).start()

    def _listen(self, fd: int) -> None:
        data = b""
        while not data.endswith(b"\n"):
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                os._exit(0)
            data += chunk
        os.close(fd)
        self.word = json.loads(data)
        self._said.set()

    def wait(self) -> dict:
        self._said.wait()
        return self.word


def split_go_fd(argv: list[str]) -> tuple[int | None, list[str]]:
    if argv[:1] == ["--go-fd"] and len(argv) > 1 and argv[1].isdigit():
        return int(argv[1]), argv[2:]
    return None, argv


def leave(code: int) -> NoReturn:
    """Exit now with ``code``: no atexit handlers, so no JAX shutdown barrier waiting for peers
    that will never come."""
    program.leave(code)


# --- the job-wide session -----------------------------------------------------------------------


class Session:
    """This process's part in the JAX job: its initialization, the watcher, how it leaves."""

    def __init__(self, jax, config: Config):
        self.jax = jax
        self.config = config
        self.store: Store | None = None  # a job of more than one process has one
        self._finishing = threading.Lock()  # the watcher or the main thread, whichever ends us
        self._closing = threading.Event()
        self._watcher: threading.Thread | None = None
        self._finished = False
        self._real_shutdown = jax.distributed.shutdown

    def initialize(self) -> None:
        config = self.config
        try:
            self.jax.distributed.initialize(
                coordinator_address=config.coordinator,
                num_processes=config.num_processes,
                process_id=config.process_id,
                initialization_timeout=config.init_timeout,
                # Every value is given: no cluster detection. Its Kubernetes one (any pod, with the
                # kubernetes package installed) reads the service account token and asks the API
                # server about the pod, which fails without the token or RBAC.
                cluster_detection_method="deactivate",
            )
        except Exception as error:  # noqa: BLE001 - JAX raises its own runtime error types
            text = program.describe(error)
            report(config, "refused", INIT_FAILED, reason=reasons.Reasons.RENDEZVOUS_FAILED, error=text)
            _say(f"process {config.process_id} could not join the coordinator at {config.coordinator}: {text}")
            leave(INIT_FAILED)
        if config.num_processes > 1:  # None: no stop records, the exit codes still hold (said once)
            self.store = compat.coordination_store()
        self._patch()
        if self.store is not None:
            self._watcher = threading.Thread(target=self._watch, name="trainer-launcher-jax", daemon=True)
            self._watcher.start()

    # --- the program's own calls ----------------------------------------------------------------

    def _patch(self) -> None:
        config, jax = self.config, self.jax
        said: list[bool] = []

        def initialize(
            coordinator_address=None, num_processes=None, process_id=None, local_device_ids=None, *args, **kwargs
        ):
            if num_processes not in (None, config.num_processes) or process_id not in (None, config.process_id):
                raise RuntimeError(
                    f"jax.distributed.initialize(num_processes={num_processes!r}, process_id={process_id!r}): "
                    f"trainer-launcher already initialized this process as process {config.process_id} of "
                    f"{config.num_processes} (JAX_PROCESS_ID, JAX_NUM_PROCESSES); run with "
                    "LAUNCHER_JAX_INITIALIZE=0 to initialize it yourself"
                )
            ignored = []
            if coordinator_address not in (None, config.coordinator):
                ignored.append(f"coordinator_address={coordinator_address!r}")
            if local_device_ids is not None:
                ignored.append(f"local_device_ids={local_device_ids!r}")
            if ignored and not said:
                said.append(True)
                _say(
                    f"jax.distributed.initialize() ignored {', '.join(ignored)}: trainer-launcher initialized "
                    f"this process already, with coordinator {config.coordinator}"
                )

        def shutdown():
            self.finish()
            self._real_shutdown()

        jax.distributed.initialize = initialize
        jax.distributed.shutdown = shutdown

    # --- watching for a peer's failure ------------------------------------------------------------

    def _store(self) -> Store:
        """The job's store, where the caller knows there is one (the watcher, a finish or stop)."""
        if self.store is None:
            raise RuntimeError("the JAX job's coordination store is used where it has none")
        return self.store

    def _watch(self) -> None:
        while not self._closing.is_set():
            try:
                value = self._store().get(self.config.stop_key, WATCH_MS)
            except Exception as error:  # noqa: BLE001 - a timeout, or a store that is gone
                if "DEADLINE_EXCEEDED" not in str(error):
                    self._closing.wait(WATCH_MS / 1000)  # JAX's own error polling ends us if it is gone
                continue
            record = records.StopRecord.parse(value)
            if record is not None and record.generation != self.config.generation:
                self._closing.wait(WATCH_MS / 1000)  # another generation's record: not this one's stop
                continue
            if record is None or not self._finishing.acquire(blocking=False):
                return  # the job finished (the store holds DONE), or we are ending already
            self._stop(record)

    def _stop(self, record) -> None:
        """A peer failed first: hand its record to the launcher and exit with its code."""
        config = self.config
        code = record.exit_code or 1
        report(config, "stopped", code, stopped_by=record.to_json())
        _say(
            f"process {config.process_id} stops: process {record.rank} on {record.node} "
            f"failed first (exit code {record.exit_code})"
        )
        self._leave_store()
        leave(code)

    def _leave_store(self) -> None:
        """Say we read the stop record; process 0 keeps the store up until everyone has."""
        config = self.config
        try:
            self._store().set(ACK_PREFIX + str(config.process_id), "1", overwrite=True)
        except Exception:  # noqa: BLE001 - the store is gone: nobody left to read it
            return
        if config.process_id != 0:
            return
        deadline = time.monotonic() + LINGER
        while time.monotonic() < deadline:
            try:
                if len(self._store().dir_get(ACK_PREFIX)) >= config.num_processes:
                    return
            except Exception:  # noqa: BLE001
                return
            time.sleep(0.02)

    # --- how the program ended ------------------------------------------------------------------

    def failed(self, code: int, error: str | None) -> None:
        """The program failed: publish or adopt the stop record, tell the launcher, exit. Never returns."""
        config = self.config
        if not self._finishing.acquire(blocking=False):
            threading.Event().wait()  # the watcher is ending the process for a peer's failure
        if self.store is None or config.num_processes == 1:
            report(config, "failed", code, error=error)
            leave(code)
        if error and PEER_LOSS.search(error) and self.store.try_get(config.stop_key) is None:
            try:
                self.store.get(config.stop_key, int(PEER_WAIT * 1000))
            except Exception as unanswered:  # noqa: BLE001 - nobody published: a peer vanished without a word
                # The store itself gone (not a wait that timed out): the coordinator's pod was lost.
                gone = None if "DEADLINE_EXCEEDED" in str(unanswered) else config.coordinator
                report(config, "peerLost", code, error=error, peer=gone)
                leave(code)
        mine = records.StopRecord(
            config.generation,
            node=config.node,
            node_rank=config.process_id,
            rank=config.process_id,
            exit_code=code,
            error=error,
        )
        won, record = records.claim(self.store, mine)
        if not won:
            self._stop(record)
        report(config, "failed", code, error=error)
        self._leave_store()
        leave(code)

    def finish(self) -> None:
        """The program succeeded: meet the others (a peer failing meanwhile ends us through the
        watcher), wake every watcher, stop ours; JAX's shutdown then finds everyone there."""
        if self._finished:
            return
        self._finished = True
        if self._watcher is None:
            return
        try:
            self._store().barrier(FINISHED_BARRIER, FINISH_TIMEOUT_MS)
        except Exception as error:  # noqa: BLE001 - a peer failed or vanished
            time.sleep(PEER_WAIT)  # its stop record, if any, reaches the watcher meanwhile
            self.failed(1, f"the job's final barrier failed: {program.describe(error)}")
        with contextlib.suppress(Exception):  # another process woke them first
            self._store().set(self.config.stop_key, DONE, overwrite=False)
        self._closing.set()
        self._watcher.join()


def _import_jax():
    """(jax, None), or (None, the error in a line): ImportError, or a broken install, said after go."""
    try:
        import jax
    except Exception as error:  # noqa: BLE001
        return None, program.describe(error)
    return jax, None


# Where crashed() finds the report path once main() has taken REPORT_ENV from the program's sight.
_reports_to: list[str | None] = []


def crashed(error: BaseException, report_path: str | None) -> None:
    """This runner's own bug (the program's failures never get here: run_program catches them):
    its traceback, then a report the launcher turns into LauncherError, exit 70."""
    import traceback

    traceback.print_exception(error)
    record = records.report("crashed", crash.INTERNAL_ERROR, error=crash.describe(error), where=crash.crash_site(error))
    records.write(report_path, record)
    leave(crash.INTERNAL_ERROR)


def main(argv: list[str] | None = None) -> None:
    go_fd, argv = split_go_fd(sys.argv[1:] if argv is None else argv)
    go = Go(go_fd)
    kind, target, args = parse_target(argv)
    program.set_sys_path(kind, target, os.path.dirname(os.path.realpath(__file__)))
    # Before the import: a jax out of range is never loaded (refused after the go word, so a
    # runner the launcher sends away leaves quietly).
    refused = check_version()
    if refused is None:
        jax, import_error = _import_jax()
    os.environ.update(go.wait().get("env", {}))
    program.register_stacks()
    config = Config(dict(os.environ))
    _reports_to.append(config.report_path)  # for crashed(): the next line hides it from the program
    for name in (REPORT_ENV, INIT_TIMEOUT_ENV):
        os.environ.pop(name, None)  # ours, not the program's
    if refused is not None:
        version_gate(config)  # the go word may carry LAUNCHER_ALLOW_UNTESTED_VERSIONS
        jax, import_error = _import_jax()
    if import_error is not None:
        report(config, "refused", 2, reason=reasons.Reasons.CONFIG_ERROR, error=import_error)
        _usage_error(f"{sys.executable} cannot import jax: {import_error}")
    if os.environ.get(CPU_COLLECTIVES_ENV):  # jax read its variables at import, before the launcher's word came
        compat.cpu_collectives(jax, os.environ[CPU_COLLECTIVES_ENV])
    session = None
    if config.coordinator is not None:
        session = Session(jax, config)
        session.initialize()
    ending = program.run_program(kind, target, args)
    if session is not None:
        if ending.interrupted:
            program.leave(ending.status, interrupted=True)  # told to stop, not a failure to publish
        elif ending.status == 0:
            session.finish()
        else:
            session.failed(ending.status, program.describe(ending.error))
    program.exit_as_python(ending)


if __name__ == "__main__":
    try:
        main()
    except Exception as error:  # jax's own errors and the program's go on as before
        if not crash.raised_in_launcher(error):
            raise
        crashed(error, _reports_to[-1] if _reports_to else os.environ.get(REPORT_ENV))
