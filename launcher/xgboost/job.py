"""``trainer-launcher xgboost``: DMLC_* -> plan -> tracker and workers, supervised -> outcome.

For a ``python ...`` command, two processes start first thing, before this one imports anything
heavy (pydantic included): a tracker (launcher/xgboost/tracker.py, which leaves at once on any pod
but 0) and the first worker's runner (launcher/xgboost/run.py). Their ``import xgboost`` overlaps
the launcher's validation and planning; then each gets a go word with what the plan decided, or
its pipe closes and it leaves without a word (bad input, a signal, a plan that runs otherwise: a
program-run tracker, or more than one worker per pod, whose thread counts must be set before the
import). The other planned workers start once the plan is made.

Pod 0's workers get their go word once the tracker says it listens (on its own pipe: a probe
connection would make it log a failed handshake). Every other pod's workers get theirs once the
tracker's name resolves and its port accepts; if it never does, the pod exits 138 naming the
tracker. A job whose workers never all join the tracker (a pod still pending) ends the same way
after the rendezvous timeout. A command the runner cannot wrap (not ``python ...``), or any
command in program mode, starts after the waits, as given.

Once running, the pods share one stop record through pod 0's board (launcher/xgboost/board.py): a
pod whose worker or tracker failed on its own posts its outcome, every other pod stops its workers
and exits with that outcome's code, naming the same worker (PeerFailed).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable

from launcher.core.supervisor import Child, Interrupted, Supervisor
from launcher.core import python_argv
from launcher.xgboost import board as board_module
from launcher.xgboost import run as runner_module
from launcher.xgboost import tracker as tracker_module

if TYPE_CHECKING:
    from launcher.status.monitor import Monitor
    from launcher.core.outcome import Outcome
    from launcher.core.settings import LauncherSettings, Override
    from launcher.xgboost.plan import Worker, XGBoostPlan

RUNNER = os.path.abspath(runner_module.__file__)
TRACKER = os.path.abspath(tracker_module.__file__)
PLACEHOLDER = ("python", "SCRIPT")
# How often another pod knocks on the tracker's port while it is not up yet, at most. Every job's
# start waits on it, and netwait's backoff (up to 2 s) would add most of a step to each start; a
# refused connection costs the tracker's host one reset, and the knocking stops once it listens.
KNOCK_INTERVAL = 0.2
# A pod whose workers only lost a peer: how long it waits for the board to name the root cause.
PEER_WAIT = 2.0
SERVE_STEP = 0.2


def make_plan(xgboost_overrides: dict[str, Override], rest: list[str], require_program: bool = True) -> XGBoostPlan:
    """Read and validate DMLC_* and the knobs, read the host, plan this pod."""
    from launcher.core import settings
    from launcher.core.devices import probe_host
    from launcher.core.outcome import ConfigError
    from launcher.core.settings import HostEnv
    from launcher.xgboost.plan import XGBoostFacts, plan_xgboost
    from launcher.xgboost.settings import XGBoostSettings, load_xgboost

    xgboost = load_xgboost(xgboost_overrides)
    if not rest:
        if require_program:
            raise ConfigError("PROGRAM", None,
                              "a program after the options: trainer-launcher xgboost [OPTIONS] -- python train.py [ARGS...]")
        rest = list(PLACEHOLDER)
    host_env = settings.load(HostEnv)
    host = probe_host(host_env)
    facts = XGBoostFacts(
        hostname=host.hostname,
        gpu_count=host.gpu_count,
        cuda_visible_devices=host_env.cuda_visible_devices,
        whole_cpus=host.whole_cpus,
        omp_num_threads_set=host.omp_num_threads_set,
        python=sys.executable,
        runner=RUNNER,
        tracker_script=TRACKER,
    )
    sources = {name: source for name in XGBoostSettings.model_fields
               if (source := settings.source_of(XGBoostSettings, name, xgboost_overrides))}
    return plan_xgboost(xgboost, facts, tuple(rest), sources)


def run_xgboost(launcher_overrides: dict[str, Override], xgboost_overrides: dict[str, Override], rest: list[str]) -> int:
    command = python_argv.parse(rest)
    tracker_flag = xgboost_overrides.get("tracker")
    program_mode = tracker_flag is not None and str(tracker_flag.value).strip().lower() == "program"
    with Supervisor() as supervisor:
        pod = _Pod(supervisor, tempfile.mkdtemp(prefix="trainer-launcher-xgboost-"))
        try:
            if command is not None and not program_mode:
                pod.start_early(command)
            from launcher.core.report import run_command  # pydantic: while xgboost imports

            return run_command(launcher_overrides, lambda launcher: pod.run(launcher, xgboost_overrides, rest))
        finally:
            pod.close()


def _summary(plan: XGBoostPlan) -> str:
    first, last = plan.workers[0].task_id, plan.workers[-1].task_id
    tasks = f"task {first}" if first == last else f"tasks {first}-{last}"
    where = "here" if plan.runs_tracker else f"by the {plan.tracker_by}"
    return (f"xgboost: pod {plan.pod_index}, {plan.workers_per_pod} worker(s) ({tasks} of {plan.num_worker}); "
            f"tracker {plan.tracker_host}:{plan.tracker_port} run {where}: {' '.join(plan.argv[:8])}")


@dataclass
class _Spawned:
    worker: Worker
    child: Child | None = None
    report_path: str = ""
    early: bool = False  # the runner started before the plan, with a go pipe of its own


@dataclass
class _Pod:
    """One pod's run: spawn, plan, wait, go, watch the joins, judge."""

    supervisor: Supervisor
    workdir: str
    launcher: LauncherSettings | None = None
    plan: XGBoostPlan | None = None
    workers: list[_Spawned] = field(default_factory=list)
    tracker: Child | None = None
    tracker_ready: bool = False
    joined: set[int] = field(default_factory=set)
    join_timeout: Outcome | None = None
    early_runner: Child | None = None
    early_tracker: Child | None = None
    board: board_module.Board | None = None  # pod 0
    board_client: board_module.BoardClient | None = None  # every other pod
    posted: bool = False  # this pod's failure went to the board
    monitor: Monitor | None = None  # progress, the TrainJob's status (pod 0 sends), hangs
    watched: dict[str, str] = field(default_factory=dict)  # the monitor's variables for the workers
    adopted: dict | None = None  # another pod's stop record
    pod_0_lost: bool = False
    _fds: dict[str, int] = field(default_factory=dict)

    # --- pipes -----------------------------------------------------------------------------------

    def _pipe(self, name: str) -> tuple[int, int]:
        read_fd, write_fd = os.pipe()
        self._fds[f"{name}-r"], self._fds[f"{name}-w"] = read_fd, write_fd
        return read_fd, write_fd

    def _close(self, name: str) -> None:
        fd = self._fds.pop(name, -1)
        if fd != -1:
            self.supervisor.unwatch(fd)
            os.close(fd)

    def close(self) -> None:
        if self.monitor is not None:
            self.monitor.close()  # after the outcome's delivery: its final status has gone out
        for name in list(self._fds):
            self._close(name)
        for side in (self.board, self.board_client):
            if side is not None:
                side.close()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def _send(self, name: str, word: bytes) -> None:
        fd = self._fds.get(name, -1)
        if fd != -1:
            try:
                os.write(fd, word)
            except BrokenPipeError:
                pass  # it is gone; the supervisor has seen it
        self._close(name)

    # --- starting ------------------------------------------------------------------------------

    def _report_path(self, task_id: int | str) -> str:
        return os.path.join(self.workdir, f"worker-{task_id}.json")

    def start_early(self, command: python_argv.PythonCommand) -> None:
        """The tracker and the first runner, before validation: they import xgboost meanwhile."""
        go_r, _ = self._pipe("tracker-go")
        ready_r, ready_w = self._pipe("tracker-ready")
        self.early_tracker = self.supervisor.spawn(
            "tracker", [command.interpreter, TRACKER, "--go-fd", str(go_r), "--ready-fd", str(ready_w)],
            pass_fds=(go_r, ready_w), transform=lambda line: f"[tracker] {line}")
        self._close("tracker-go-r")
        self._close("tracker-ready-w")
        self.supervisor.watch(ready_r, self._on_ready)
        go_r, _ = self._pipe("runner-go")
        joined_r, joined_w = self._pipe("joined")
        options = ["--go-fd", str(go_r), "--joined-fd", str(joined_w), "--report", self._report_path("early")]
        argv = [command.interpreter, *command.options, RUNNER, *options, *command.target_argv(), *command.args]
        self.early_runner = self.supervisor.spawn("worker-0", argv, pass_fds=(go_r, joined_w))
        self._close("runner-go-r")

    def run(self, launcher: LauncherSettings, xgboost_overrides: dict[str, Override], rest: list[str]) -> Outcome:
        from launcher.core import log, versions, workspace
        from launcher.core.outcome import LauncherError, WaitTimeout, evidence_regex

        self.launcher = launcher
        self.supervisor.grace_period = launcher.grace_period
        self.supervisor.evidence = evidence_regex(launcher.retryable_pattern)
        try:
            # This interpreter's Python; the runners check the program's xgboost where it runs.
            versions.check("python", allow=launcher.allow_untested_versions)
            self.plan = plan = make_plan(xgboost_overrides, rest)
        except LauncherError as error:
            return error.outcome().on_node(socket.gethostname())
        workspace.warn_if_unwritable()
        log.info(_summary(plan), plan=plan.to_json())
        from launcher.status.monitor import start as start_monitor

        # Progress, the TrainJob's status (pod 0 sends) and hangs.
        self.monitor = start_monitor(launcher, self.supervisor, node=plan.node, sends=plan.pod_index == 0)
        self.watched = self.monitor.rank_env() if self.monitor is not None else {}
        self.watched.update(allowed_env(launcher))  # the runners' version gate reads it after the go word
        deadline = time.monotonic() + launcher.rendezvous_timeout
        try:
            self._open_board()
            self._start_tracker()
            self._start_runners()
            self._wait(deadline)
        except Interrupted:
            return self._outcome()  # a signal, or a process ended early: the supervisor tears down
        except WaitTimeout as error:
            self.supervisor.kill_all()
            self.supervisor.run()
            return error.outcome().on_node(plan.node)
        self._join_board()
        if plan.runner:
            self._go()
            self._watch_joins(time.monotonic() + launcher.rendezvous_timeout)
        else:
            for spawned in self.workers:
                self._spawn(spawned, [], ())
        self._serve()
        return self._final()

    # --- the board: one stop record for the whole job ------------------------------------------

    def _open_board(self) -> None:
        from launcher.core import log

        if self.plan.pod_index != 0:
            return
        port = self.plan.tracker_port + board_module.PORT_OFFSET
        peers = board_module.peer_policy(self.plan.tracker_host, self.plan.pods)
        try:
            self.board = board_module.Board(port, ":" in self.plan.tracker_host, self.supervisor.watch,
                                            self.supervisor.unwatch, self._on_record, self.plan.pods, peers)
        except (OSError, OverflowError) as error:
            log.warning(f"xgboost: no stop board on port {port} ({getattr(error, 'strerror', None) or error}): "
                        "a failure elsewhere reaches this pod only through xgboost's own collective")
            return
        if peers.kind == "anyone":
            log.warning(f"xgboost: DMLC_TRACKER_URI={self.plan.tracker_host} is not the controller's "
                        "<trainjob>-node-0-0.<trainjob>, so the stop board cannot tell the pods' addresses from "
                        f"others': it takes a well-formed stop record from any peer that reaches port {port}")

    def _join_board(self) -> None:
        from launcher.core import log

        if self.plan.pod_index == 0:
            return
        port = self.plan.tracker_port + board_module.PORT_OFFSET
        try:
            self.board_client = board_module.BoardClient(self.plan.tracker_host, port, self.supervisor.watch,
                                                         self.supervisor.unwatch, self._on_record, self._on_lost,
                                                         self.plan.pods)
        except (OSError, OverflowError) as error:
            log.warning(f"xgboost: pod 0's stop board at {self.plan.tracker_host}:{port} is out of reach "
                        f"({getattr(error, 'strerror', None) or error}): a failure elsewhere reaches this pod "
                        "only through xgboost's own collective")

    def _on_record(self, record: dict) -> None:
        if record.get("pod") != self.plan.pod_index and self.adopted is None:
            self.adopted = record
            self.supervisor.begin_teardown()

    def _on_lost(self) -> None:
        if any(c.returncode is None for c in self.supervisor.children) and not self.posted:
            self.pod_0_lost = True
            self.supervisor.begin_teardown()

    def _post_own_failure(self) -> None:
        """Once a process here failed on its own (not a worker that only lost a peer), tell the board."""
        if self.posted or self.adopted is not None:
            return
        if self.supervisor.first_failure is None and self.join_timeout is None:
            return
        from launcher.core.outcome import Reasons

        outcome = self._judge()
        if outcome.exit_code == 0 or outcome.reason in (Reasons.PEER_LOST, Reasons.TERMINATED):
            return
        record = {"pod": self.plan.pod_index, "outcome": outcome.to_json(self.launcher.retryable_exit_codes)}
        self.posted = True
        if self.board is not None:
            self.board.post(record)
        elif self.board_client is not None:
            self.board_client.post(record)

    def _serve(self) -> None:
        """The supervisor's loop, looking after every step for a failure to post."""
        while any(c.returncode is None for c in self.supervisor.children):
            self.supervisor.poll(SERVE_STEP)
            self._post_own_failure()
        self.supervisor.run()  # orphans, the last output

    def _serve_for(self, seconds: float, done: Callable[[], bool]) -> None:
        end = time.monotonic() + seconds
        while not done() and time.monotonic() < end:
            self.supervisor.poll(min(SERVE_STEP, max(0.0, end - time.monotonic())))

    def _final(self) -> Outcome:
        from launcher.core.outcome import Outcome, Reasons, RootCause, stopped_by

        node = self.plan.node
        own = self._judge()
        self._post_own_failure()
        if self.board is not None:
            if own.exit_code == 0 and self.adopted is None:
                self.board.finish()
            else:  # the others read the record before this pod, and its board, go away
                self._serve_for(board_module.LINGER, lambda: self.board.clients == 0)
        elif self.board_client is not None and own.reason == Reasons.PEER_LOST and self.adopted is None:
            self._serve_for(PEER_WAIT, lambda: self.adopted is not None or self.pod_0_lost)
        if self.adopted is not None:  # board.check_record vouched for its shape, and its pod's address
            root = Outcome.from_json(self.adopted["outcome"])
            return stopped_by(replace(root, message=f"{root.message} (reported by pod {self.adopted['pod']})"), node)
        if self.pod_0_lost:
            return Outcome.of(Reasons.PEER_LOST,
                              f"pod 0 ({self.plan.tracker_host}), which runs the XGBoost tracker, went away without a "
                              f"word while {node}'s workers ran; {node} stopped them", RootCause(node=node))
        return own

    def _start_tracker(self) -> None:
        plan = self.plan
        if not plan.runs_tracker:
            self._close("tracker-go-w")  # the early one leaves without a word
            return
        if self.early_tracker is not None:
            self.tracker = self.early_tracker
            word = {"workers": plan.num_worker, "port": plan.tracker_port, "host": plan.tracker_argv[-1]}
            self._send("tracker-go-w", json.dumps(word).encode() + b"\n")
            return
        ready_r, ready_w = self._pipe("tracker-ready")
        self.tracker = self.supervisor.spawn(
            "tracker", [*plan.tracker_argv, "--ready-fd", str(ready_w)], pass_fds=(ready_w,),
            transform=lambda line: f"[tracker] {line}")
        self._close("tracker-ready-w")
        self.supervisor.watch(ready_r, self._on_ready)

    def _start_runners(self) -> None:
        """Every planned worker: the early runner as worker 0 when the plan has one worker per pod
        run through the runner, and the rest (or all) now, waiting for their go word."""
        plan = self.plan
        self.workers = [_Spawned(w, report_path=self._report_path(w.task_id)) for w in plan.workers]
        reuse = self.early_runner is not None and plan.runner and plan.workers_per_pod == 1
        if self.early_runner is not None and not reuse:
            self._close("runner-go-w")
        if reuse:
            first = self.workers[0]
            first.child, first.report_path, first.early = self.early_runner, self._report_path("early"), True
        if not plan.runner:
            return
        rest = [spawned for spawned in self.workers if spawned.child is None]
        if not rest:
            return
        go_r, _ = self._pipe("go")
        if "joined-r" not in self._fds:
            self._pipe("joined")
        joined_w = self._fds["joined-w"]
        for spawned in rest:
            self._spawn(spawned, ["--go-fd", str(go_r), "--joined-fd", str(joined_w), "--report", spawned.report_path],
                        (go_r, joined_w))
        self._close("go-r")

    def _spawn(self, spawned: _Spawned, options: list[str], fds: tuple[int, ...]) -> None:
        from launcher.core import settings

        worker, argv = spawned.worker, list(self.plan.argv)
        if options:  # the runner's own, between it and the program
            at = argv.index(RUNNER) + 1
            argv[at:at] = options
        transform = (lambda line, task=worker.task_id: f"[rank-{task}]: {line}") if len(self.workers) > 1 else None
        spawned.child = self.supervisor.spawn(f"worker-{worker.task_id}", argv,
                                              {**settings.environ(), **worker.env_set, **self.watched}, pass_fds=fds,
                                              transform=transform)

    def _go(self) -> None:
        self._close("joined-w")  # the runners hold it now: its end of file means they all left
        self.supervisor.watch(self._fds["joined-r"], self._on_joined)
        for spawned in self.workers:
            if spawned.early:
                env = {**spawned.worker.env_set, **self.watched}
                self._send("runner-go-w", json.dumps({"env": env}).encode() + b"\n")
        shared = sum(1 for spawned in self.workers if not spawned.early)
        if shared:
            self._send("go-w", runner_module.GO_WORD * shared)

    # --- waiting -------------------------------------------------------------------------------

    def _on_ready(self) -> None:
        fd = self._fds["tracker-ready-r"]
        self.tracker_ready = bool(os.read(fd, 64))
        self._close("tracker-ready-r")

    def _on_joined(self) -> None:
        data = os.read(self._fds["joined-r"], 65536)
        if not data:
            self._close("joined-r")
            return
        self.joined.update(int(word) for word in data.split() if word.isdigit())

    def _sleep(self, seconds: float) -> None:
        """Serve for ``seconds``; Interrupted once a signal stops the job, a process failed, or
        the tracker ended (an early helper the plan sent away may leave quietly)."""
        end = time.monotonic() + seconds
        while True:
            self.supervisor.poll(max(0.0, min(end - time.monotonic(), 0.5)))
            if self.supervisor.received_signal is not None or self.supervisor.first_failure is not None:
                raise Interrupted()
            if self.tracker is not None and self.tracker.returncode is not None:
                raise Interrupted()
            if time.monotonic() >= end:
                return

    def _wait(self, deadline: float) -> None:
        """The tracker's name, then its port (other pods) or its ready word (pod 0)."""
        from launcher.core import log, netwait
        from launcher.core.outcome import WaitTimeout

        plan = self.plan
        try:
            if plan.resolve:
                netwait.wait_until_resolves(plan.resolve, deadline, self._sleep, log.info)
            if plan.connect:
                netwait.wait_until_accepts(*plan.connect, deadline, lambda s: self._sleep(min(s, KNOCK_INTERVAL)),
                                           log.info)
        except WaitTimeout as error:
            raise WaitTimeout(f"the XGBoost tracker (DMLC_TRACKER_URI:DMLC_TRACKER_PORT, pod 0) never came up "
                              f"within {self.launcher.rendezvous_timeout:g}s: {error}") from None
        if self.tracker is not None:
            while not self.tracker_ready:
                if time.monotonic() >= deadline:
                    raise WaitTimeout(f"the XGBoost tracker on {plan.node} did not listen on port "
                                      f"{plan.tracker_port} within {self.launcher.rendezvous_timeout:g}s")
                self._sleep(min(0.5, max(0.0, deadline - time.monotonic())))

    def _watch_joins(self, deadline: float) -> None:
        """Serve until every local worker has joined the tracker, or time the job out."""
        from launcher.core.outcome import Outcome, Reasons, RootCause

        expected = {spawned.worker.task_id for spawned in self.workers}
        supervisor = self.supervisor
        while not expected <= self.joined:
            if supervisor.received_signal is not None or supervisor.first_failure is not None:
                return
            if all(s.child.returncode is not None for s in self.workers):
                return
            self._post_own_failure()
            if time.monotonic() >= deadline:
                missing = sorted(expected - self.joined)
                self.join_timeout = Outcome.of(
                    Reasons.RENDEZVOUS_TIMEOUT,
                    f"XGBoost task(s) {', '.join(map(str, missing[:20]))} on {self.plan.node} did not join the tracker "
                    f"at {self.plan.tracker_host}:{self.plan.tracker_port} within "
                    f"{self.launcher.rendezvous_timeout:g}s: it waits for all DMLC_NUM_WORKER={self.plan.num_worker} "
                    "workers (a pod still pending, or pods that see different GPU counts?)",
                    RootCause(node=self.plan.node))
                supervisor.begin_teardown()
                return
            supervisor.poll(min(0.5, max(0.0, deadline - time.monotonic())))

    # --- judging -------------------------------------------------------------------------------

    def _outcome(self) -> Outcome:
        self.supervisor.run()
        return self._judge()

    def _judge(self) -> Outcome:
        """This pod's own outcome, from what has happened so far."""
        from launcher.core.outcome import RootCause, classify, last_lines, success, terminated

        supervisor, node = self.supervisor, self.plan.node
        if self.monitor is not None and self.monitor.hang is not None:
            return self.monitor.hang
        if self.join_timeout is not None:
            return self.join_timeout
        first = supervisor.first_failure
        if first is None:
            if supervisor.received_signal is not None:
                return terminated(supervisor.received_signal).on_node(node)
            return success()
        codes = self.launcher.retryable_exit_codes
        if first is self.tracker or first is self.early_tracker:
            outcome = classify(first.returncode, retryable_codes=codes, evidence=first.evidence,
                               root_cause=RootCause(node=node), what=f"the XGBoost tracker on {node}")
            return outcome.with_extra(**last_lines(first.tail))
        spawned = self._root_worker(first)
        if spawned is None:  # a runner the plan had sent away: it failed before its go word
            early = classify(first.returncode, retryable_codes=codes, evidence=first.evidence,
                             what=f"the XGBoost worker started early on {node}")
            return early.with_extra(**last_lines(first.tail)).on_node(node)
        return self._worker_outcome(spawned)

    def _root_worker(self, first: Child) -> _Spawned | None:
        """The worker that failed on its own: the first to fail, unless it only lost a peer and a
        neighbour on this pod failed on its own a moment later."""
        spawned = next((s for s in self.workers if s.child is first), None)
        if spawned is None or not self._peer_lost(spawned):
            return spawned
        own = [s for s in self.workers if s.child is not None and s.child.returncode not in (0, None)
               and _read_report(s.report_path) is not None and not self._peer_lost(s)]
        return min(own, key=lambda s: s.child.exited_at) if own else spawned

    def _peer_lost(self, spawned: _Spawned) -> bool:
        report = _read_report(spawned.report_path)
        if report is not None:
            return bool(report.get("peerLost"))
        # No report (program mode, or killed): what xgboost printed before the end.
        return bool(runner_module.PEER_LOSS.search("\n".join(spawned.child.tail)))

    def _worker_outcome(self, spawned: _Spawned) -> Outcome:
        from launcher.core.outcome import Outcome, Reasons, RootCause, classify, internal_error, last_lines, signal_name

        child, worker, node = spawned.child, spawned.worker, self.plan.node
        returncode = child.returncode
        cause = RootCause(node=node, rank=worker.task_id, local_rank=worker.local_rank,
                          exit_code=returncode if returncode > 0 else None,
                          signal=signal_name(-returncode) if returncode < 0 else None)
        what = f"XGBoost worker (task {worker.task_id}) on {node}"
        report = _read_report(spawned.report_path) or {}
        if report.get("reason") == Reasons.LAUNCHER_ERROR and report.get("error"):
            # The runner's own bug, not the program's failure (launcher/core/crash.py).
            return internal_error(report["error"], None, node)
        if report.get("reason") == Reasons.UNSUPPORTED_VERSION and report.get("error"):
            # The runner refused the interpreter's xgboost before importing it (launcher/core/versions.py).
            return Outcome.of(Reasons.UNSUPPORTED_VERSION, f"{what}: {report['error']}", cause)
        if self._peer_lost(spawned):
            # Worded so launcher.core.job_outcome (PEER_LOSS_PATTERN) never takes this pod for the
            # job's root cause: xgboost's own words ("Encountered EOF. The other end is likely
            # closed.") say the same thing, but not in the pattern's.
            said = report.get("error") or _peer_loss_line(child)
            outcome = Outcome.of(Reasons.PEER_LOST,
                                 f"{what} lost a peer: a worker on another pod failed or went away, or the tracker did",
                                 cause, evidence=f"connection closed by peer: {said}"[:500])
        else:
            outcome = classify(returncode, retryable_codes=self.launcher.retryable_exit_codes,
                               evidence=child.evidence, root_cause=cause, what=what)
        if report.get("error"):
            outcome = outcome.with_extra(error=report["error"])
        return outcome.with_extra(**last_lines(child.tail))


def allowed_env(launcher: LauncherSettings) -> dict[str, str]:
    """``--allow-untested-versions 1`` for the runners, which read only the variable."""
    return {"LAUNCHER_ALLOW_UNTESTED_VERSIONS": "1"} if getattr(launcher, "allow_untested_versions", False) else {}


def _peer_loss_line(child: Child) -> str:
    return next((line.strip() for line in reversed(child.tail) if runner_module.PEER_LOSS.search(line)),
                "the collective's connection failed")


def _read_report(path: str) -> dict | None:
    try:
        with open(path) as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
