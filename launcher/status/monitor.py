"""Watch a job from inside the launcher: progress from the ranks, the TrainJob's status, hangs.

One monitor per launcher process, attached to its supervisor's loop. It gathers progress from
every source the ranks may use (their output lines, ``launcher.progress.report``, a JSON-lines
file, and the Kubeflow SDK's or HuggingFace's own status calls, which reach a local relay instead
of the status server) into one tracker. The one pod that sends for the job (its framework says
which: the first node, or the launcher pod) turns the tracker into the TrainJob's ``trainerStatus``,
at most once per interval, and the job's outcome into its final status. With ``--hang-timeout``
the tracker also decides when the job has stopped making progress: then every rank's Python stack
is taken, the job is torn down, and it ends as a retryable ``Hang``.

It changes nothing unless it is wanted: without the status server's variables and without a hang
timeout, no monitor is made and the ranks' environment is the user's.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from launcher.core import log, report, settings
from launcher.core.outcome import Outcome, Reasons, RootCause, is_retryable

if TYPE_CHECKING:  # the rest is imported only when a monitor is made
    from launcher.core.settings import LauncherSettings
    from launcher.core.supervisor import Child, Supervisor
    from launcher.status.hang import Hang
    from launcher.status.lines import Observation
    from launcher.status.settings import StatusEnv

PROGRESS_FILE_ENV = "LAUNCHER_PROGRESS_FILE"
SERVER_URL_ENV = "KUBEFLOW_TRAINER_SERVER_URL"
# How often the loop's tick does real work; the supervisor may turn many times a second.
TICK = 0.25


class Monitor:
    def __init__(
        self,
        launcher: LauncherSettings,
        server: StatusEnv | None,
        *,
        node: str,
        sends: bool,
        relays: bool = True,
        board_at: tuple[int, str] | None = None,
    ):
        """``server``: the status server's contract (None: no reporting). ``sends``: this pod
        reports the job to it (one sender per job). ``relays``: point the ranks' status URL at our
        relay; not where the ranks run in other pods (workers that mpirun reaches), which cannot reach it.
        ``board_at``: (family, address) the ranks in other pods reach us at, to answer a hang with
        their stacks (launcher.status.board); None: every rank runs here."""
        from launcher.status.hang import HangWatch
        from launcher.status.intake import JsonlTail, ProgressSocket, Relay
        from launcher.status.lines import LineParser
        from launcher.status.sender import Sender
        from launcher.status.tracker import Tracker

        self.node = node
        self.dir = tempfile.mkdtemp(prefix="trainer-launcher-status-")
        self.tracker = Tracker()
        self.parser = LineParser(re.compile(launcher.progress_regex) if launcher.progress_regex else None)
        self.socket = ProgressSocket(os.path.join(self.dir, "progress.sock"))
        self.file = launcher.progress_file or os.path.join(self.dir, "progress.jsonl")
        self.tail = JsonlTail(self.file)
        self.relay = Relay(urlsplit(server.url or "").path or "/") if server is not None and relays else None
        self.sender = Sender(server) if server is not None and sends else None
        started, self.started_wall = time.monotonic(), time.time()
        self.watch = None
        if launcher.hang_timeout > 0:
            self.watch = HangWatch(launcher.hang_timeout, launcher.hang_startup or None, started)
        self.stacks_dir = os.path.join(self.dir, "stacks")
        self.board = None
        if self.watch is not None and board_at is not None:
            from launcher.status.board import StackBoard

            try:
                self.board = StackBoard(*board_at)
            except OSError as error:
                log.warning(
                    f"no listener for the stacks of ranks in other pods ({error.strerror or error}); "
                    "a hang shows only this pod's ranks"
                )
        self.hang: Outcome | None = None
        self.restarts = 0  # restarts in place so far (launcher.core.lifecycle)
        # How a hang's stacks are taken: this pod's ranks, unless the job can ask every node
        # (a framework whose agents talk to each other replaces it). The taker logs what it takes.
        self.take_stacks: Callable[[], list] = self._local_stacks
        self._taking = False
        self.supervisor: Supervisor | None = None
        self._next_tick = started
        self._changed = False
        self._closed = False

    def rank_env(self) -> dict[str, str]:
        """What the ranks need to report to us (and nothing when nothing is watched)."""
        from launcher.status import stacks
        from launcher.status.intake import SOCKET_ENV

        env = {SOCKET_ENV: self.socket.path, PROGRESS_FILE_ENV: self.file}
        if self.relay is not None:
            env[SERVER_URL_ENV] = self.relay.url
        if self.watch is not None:
            os.makedirs(self.stacks_dir, exist_ok=True)
            env.update(stacks.rank_env(self.stacks_dir, settings.environ().get("PYTHONPATH")))
            if self.board is not None:
                env.update(self.board.env)
        return env

    def attach(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor
        supervisor.line_observers.append(self._line)
        supervisor.tickers.append(self._tick)
        supervisor.watch(self.socket.fileno(), self._datagrams)
        if self.relay is not None:
            self.relay.start()
        if self.sender is not None:
            self.sender.start()
            report.observe_delivery(self._final)

    def _attached(self) -> Supervisor:
        """The supervisor this monitor is attached to: its ticks and hangs come after :meth:`attach`."""
        if self.supervisor is None:
            raise RuntimeError("the status monitor is used before it is attached to a supervisor")
        return self.supervisor

    def overrule(self, outcome: Outcome) -> Outcome:
        """The job's outcome, unless we ended it as hung: then the ranks' exits are our teardown."""
        return self.hang if self.hang is not None else outcome

    def restarted(self, generation: int) -> None:
        """The job's processes start again in place: the status says how often, and a hang is
        looked for as in a new job (its startup limit from now)."""
        now = time.monotonic()
        self.restarts = generation
        self.tracker.restarted()
        if self.watch is not None:
            self.watch.started_at = now
        self._changed = True

    def done(self) -> None:
        """The job's processes are gone: stop listening to them. The final status still goes out
        when the outcome is delivered."""
        if self._closed:
            return
        self._closed = True
        self._observe(self.tail.read_new())
        if self.relay is not None:
            self._observe(self.relay.take())
            self.relay.close()
        if self.supervisor is not None:
            self.supervisor.unwatch(self.socket.fileno())
            self.supervisor.line_observers.remove(self._line)
            self.supervisor.tickers.remove(self._tick)
        self.socket.close()
        if self.board is not None:
            self.board.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def report(self, metrics: list[tuple[str, str]]) -> None:
        """These metrics now, beside the job's (an export's progress, after the job)."""
        if self.sender is not None:
            self.sender.offer(self._body(time.monotonic(), extra=metrics))

    def close(self) -> None:
        """Done, and no final status to send after all (the launcher ends without an outcome)."""
        self.done()
        if self.sender is not None and report.forget_delivery(self._final):
            self.sender.close(None, timeout=1.0)

    # --- sources -------------------------------------------------------------------------------

    def _observe(self, observations: list[Observation]) -> None:
        now = time.monotonic()
        for observation in observations:
            self.tracker.observe(observation, now)
            self._changed = True

    def _line(self, child: Child, text: str) -> None:
        observation = self.parser.parse(text)
        if observation is not None:
            self._observe([observation])

    def _datagrams(self) -> None:
        self._observe(self.socket.receive())

    def _tick(self) -> None:
        now = time.monotonic()
        if now < self._next_tick or self._taking:
            return
        self._next_tick = now + TICK
        self._observe(self.tail.read_new())
        if self.relay is not None:
            self._observe(self.relay.take())
        if self._changed and self.sender is not None:
            self._changed = False
            self.sender.offer(self._body(now))
        if self.watch is not None and self.hang is None and self._attached().teardown_started is None:
            found = self.watch.check(self.tracker, now)
            if found is not None:
                self._on_hang(found)

    # --- hangs ---------------------------------------------------------------------------------

    def _on_hang(self, found: Hang) -> None:
        from launcher.status import flight
        from launcher.status.hang import describe, waiting_on_others

        log.error(f"no progress for {found.stalled_for:.0f}s: taking every rank's stack, then stopping the job")
        self._taking = True  # a taker may serve the supervisor's loop while it waits
        try:
            taken = self.take_stacks()
        finally:
            self._taking = False
        found = waiting_on_others(taken, found)
        message, extra = describe(found, taken, self.node)
        dumps = flight.dumps(since=self.started_wall)
        if dumps:
            extra["flightRecorder"] = dumps[:8]
        rank = found.stopped_ranks[0] if found.stopped_ranks else None
        node = next((s.node for s in taken if s.rank == rank and s.node), self.node)
        self.hang = Outcome.of(Reasons.HANG, message, RootCause(node=node, rank=rank), extra=extra)
        self._attached().begin_teardown()

    def _local_stacks(self) -> list:
        """This pod's ranks, by signal, and at the same time those in other pods that answer on
        the board."""
        import threading

        from launcher.status import stacks

        remote: list = []
        asking = None
        if (board := self.board) is not None:
            asking = threading.Thread(target=lambda: remote.extend(board.collect()), daemon=True)
            asking.start()
        taken = stacks.collect(self.stacks_dir)
        if asking is not None:
            asking.join()
            taken = stacks.by_rank([*taken, *remote])
        stacks.echo(taken, _write)
        return taken

    # --- the TrainJob's status -----------------------------------------------------------------

    def _body(
        self,
        now: float,
        outcome: Outcome | None = None,
        codes: frozenset[int] = frozenset(),
        extra: Sequence[tuple[str, str]] = (),
    ) -> dict:
        from launcher.status.payload import trainer_status

        percent, eta = self.tracker.percent(), self.tracker.eta(now)
        metrics = [*extra, *self.tracker.metrics()]
        if self.restarts:
            metrics.append(("restarts", str(self.restarts)))
        if outcome is not None:
            if outcome.exit_code == 0:
                percent, eta = 100, 0
            metrics = [*outcome_metrics(outcome, codes), *metrics]
        return trainer_status(percent=percent, eta=eta, metrics=metrics, now=datetime.now(UTC))

    def _final(self, outcome: Outcome, codes: frozenset[int]) -> None:
        """The job's outcome, as the TrainJob's last status (a delivery observer)."""
        report.forget_delivery(self._final)
        self.done()
        if self.sender is not None:  # it observes delivery only with a sender (attach)
            self.sender.close(self._body(time.monotonic(), outcome, codes))


def outcome_metrics(outcome: Outcome, codes: frozenset[int]) -> list[tuple[str, str]]:
    """How the job ended, as metrics: what `kubectl get trainjob` and Katib can show."""
    reason = outcome.extra.get("causeReason") or outcome.reason  # PeerFailed: the root's own reason
    found = [
        ("exit_code", str(outcome.exit_code)),
        ("reason", str(reason)),
        ("retryable", str(is_retryable(outcome.exit_code, codes)).lower()),
    ]
    cause = outcome.root_cause
    if outcome.exit_code != 0 and cause is not None:
        if cause.node:
            found.append(("root_cause_node", cause.node))
        if cause.rank is not None:
            found.append(("root_cause_rank", str(cause.rank)))
    if outcome.exit_code != 0 and outcome.message:
        found.append(("message", outcome.message))
    for name, key in (("export_uri", "exportUri"), ("export_files", "exportFiles")):
        if key in outcome.extra:
            found.append((name, str(outcome.extra[key])))
    return found


def start(
    launcher: LauncherSettings,
    supervisor: Supervisor,
    *,
    node: str,
    sends: bool,
    relays: bool = True,
    board_at: tuple[int, str] | None = None,
) -> Monitor | None:
    """A monitor attached to ``supervisor``, or None when there is nothing to report to and no
    hang to catch."""
    from launcher.status.settings import status_env

    server, problem = status_env() if launcher.status_report == "auto" else (None, None)
    if problem:
        log.warning(problem)
    if server is None and problem is None and launcher.hang_timeout <= 0:
        return None
    monitor = Monitor(launcher, server, node=node, sends=sends, relays=relays, board_at=board_at)
    monitor.attach(supervisor)
    return monitor


def _write(line: str) -> None:
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except OSError:
        pass
