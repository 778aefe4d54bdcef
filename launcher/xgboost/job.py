"""``trainer-launcher xgboost``: XGBoost's part of the pod's life (launcher/core/lifecycle.py): DMLC_* ->
plan -> tracker and workers -> outcome.

For a ``python ...`` command, the first worker's runner (launcher/xgboost/run.py) starts first
thing, before this one imports anything heavy (pydantic included), and on pod 0 the tracker
(launcher/xgboost/tracker.py) with it. Their ``import xgboost`` overlaps
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

Once running, the pods share one stop record through pod 0's board (launcher/xgboost/stops.py).

A restart in place (LAUNCHER_MAX_RESTARTS, launcher/core/lifecycle.py) plans the next generation
(its tracker and board on ports of their own, launcher/xgboost/plan.py), and starts pod 0's tracker,
the board and every worker afresh, each worker told LAUNCHER_RESTART_COUNT and reporting to a file
of its generation; the board takes only that generation's stop records.
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, TypeVar

from launcher import k8s, status
from launcher.core import judge, lifecycle, python_argv
from launcher.core.supervisor import Child
from launcher.export.step import Export
from launcher.runner import report as records
from launcher.xgboost import run as runner_module
from launcher.xgboost import tracker as tracker_module
from launcher.xgboost.stops import SERVE_STEP

if TYPE_CHECKING:
    from launcher.core.lobby import Place
    from launcher.core.outcome import Outcome
    from launcher.core.settings import LauncherSettings, Override
    from launcher.xgboost.plan import Worker, XGBoostPlan
    from launcher.xgboost.stops import Stops

RUNNER = os.path.abspath(runner_module.__file__)
TRACKER = os.path.abspath(tracker_module.__file__)
# How often another pod knocks on the tracker's port while it is not up yet, at most. Every job's
# start waits on it, and netwait's backoff (up to 2 s) would add most of a step to each start; a
# refused connection costs the tracker's host one reset, and the knocking stops once it listens.
KNOCK_INTERVAL = 0.2


def make_plan(
    xgboost_overrides: dict[str, Override],
    rest: list[str],
    launcher: LauncherSettings,
    require_program: bool = True,
    generation: int = 0,
) -> XGBoostPlan:
    """Read and validate DMLC_* and the knobs, read the host, plan this pod's ``generation`` (a
    restart in place)."""
    from launcher.core.runner_command import plan_inputs
    from launcher.xgboost.plan import XGBoostFacts, plan_xgboost
    from launcher.xgboost.settings import XGBoostSettings, load_xgboost

    given = plan_inputs("xgboost", XGBoostSettings, load_xgboost, xgboost_overrides, rest, launcher, require_program)
    host = given.host
    facts = XGBoostFacts(
        hostname=host.hostname,
        gpu_count=host.gpu_count,
        cuda_visible_devices=given.host_env.cuda_visible_devices,
        whole_cpus=host.whole_cpus,
        omp_num_threads_set=host.omp_num_threads_set,
        python=sys.executable,
        runner=RUNNER,
        tracker_script=TRACKER,
    )
    return plan_xgboost(given.settings, facts, given.program, given.sources, generation, launcher.max_restarts)


def run_xgboost(
    launcher_overrides: dict[str, Override], xgboost_overrides: dict[str, Override], rest: list[str]
) -> int:
    return lifecycle.live(
        XGBoostPod(xgboost_overrides, rest), launcher_overrides, status.start_watch, Export(), k8s.in_place_restart
    )


def _summary(plan: XGBoostPlan) -> str:
    first, last = plan.workers[0].task_id, plan.workers[-1].task_id
    tasks = f"task {first}" if first == last else f"tasks {first}-{last}"
    where = "here" if plan.runs_tracker else f"by the {plan.tracker_by}"
    return (
        f"xgboost: pod {plan.pod_index}, {plan.workers_per_pod} worker(s) ({tasks} of {plan.num_worker}); "
        f"tracker {plan.tracker_host}:{plan.tracker_port} run {where}: {' '.join(plan.argv[:8])}"
    )


@dataclass
class _Spawned:
    worker: Worker
    child: Child | None = None
    report_path: str = ""
    early: bool = False  # the runner started before the plan, with a go pipe of its own


class _Tracker:
    """The XGBoost tracker this pod runs (pod 0), started early or after the plan, and whether it
    said it listens (on its own pipe: a probe connection would make it log a failed handshake)."""

    def __init__(self, life: lifecycle.Life, argv: list[str], go: lifecycle.GoPipe | None = None):
        self.ready = False
        self.go = go
        said = life.listen(self._said, 64)
        self.child = life.spawn(
            "tracker",
            [*argv, "--ready-fd", str(said.child_fd)],
            pipes=tuple(p for p in (go, said) if p is not None),
            transform=lambda line: f"[tracker] {line}",
        )
        self._said_pipe = said

    def go_pipe(self) -> lifecycle.GoPipe:
        """The go pipe of a tracker started early, before the plan."""
        return _made(self.go, "the early tracker's go pipe")

    def _said(self, data: bytes) -> None:
        self.ready = bool(data)
        self._said_pipe.close()


class XGBoostPod(lifecycle.Pod):
    """One pod: its workers (the first runner started early), pod 0's tracker, the stop board."""

    name = "xgboost"

    def __init__(self, xgboost_overrides: dict[str, Override], rest: list[str]):
        self.xgboost_overrides, self.rest = xgboost_overrides, rest
        self.early_tracker: _Tracker | None = None
        self.early_runner: Child | None = None
        self.runner_go: lifecycle.GoPipe | None = None  # the early runner's own
        self.shared_go: lifecycle.GoPipe | None = None  # the go words of the runners started after the plan
        self.joined_pipe: lifecycle.Listen | None = None  # every runner writes its task id once joined
        self.tracker: _Tracker | None = None
        self.workers: list[_Spawned] = []
        self.joined: set[int] = set()
        self.join_timeout: Outcome | None = None
        self.stops: Stops | None = None

    # --- starting ------------------------------------------------------------------------------

    def start_early(self, life: lifecycle.Life) -> None:
        """The tracker and the first runner, before validation: they import xgboost meanwhile."""
        command = python_argv.parse(self.rest)
        tracker_flag = self.xgboost_overrides.get("tracker")
        if command is None or (tracker_flag is not None and str(tracker_flag.value).strip().lower() == "program"):
            return
        if tracker_module.is_pod_0():  # elsewhere a tracker would only start and leave: a process for nothing
            go = life.go_pipe()
            self.early_tracker = _Tracker(life, [command.interpreter, TRACKER, "--go-fd", str(go.child_fd)], go)
        self.runner_go, self.joined_pipe = life.go_pipe(), self._listen_joins(life)
        pipes = {"--go-fd": self.runner_go.child_fd, "--joined-fd": self.joined_pipe.child_fd}
        options = [
            *(word for flag, fd in pipes.items() for word in (flag, str(fd))),
            "--report",
            life.path("worker-early.json"),
        ]
        argv = [command.interpreter, *command.options, RUNNER, *options, *command.target_argv(), *command.args]
        self.early_runner = life.spawn("worker-0", argv, pipes=(self.runner_go,), keep=(self.joined_pipe,))

    def plan(self, life: lifecycle.Life) -> lifecycle.Planned:
        plan = make_plan(self.xgboost_overrides, self.rest, life.launcher)
        return lifecycle.Planned(plan, plan.node, _summary(plan), sends=plan.pod_index == 0)

    def start(self, life: lifecycle.Life) -> None:
        from launcher.xgboost.stops import Stops

        if not life.generation:  # a restart closes the last generation's board itself
            life.closing(self._close_stops)
        self.stops = Stops(life.supervisor, life.plan, life.launcher.retryable_exit_codes, life.generation)
        self.stops.open()
        self._start_tracker(life)
        self._start_runners(life)

    def _start_tracker(self, life: lifecycle.Life) -> None:
        plan, early = life.plan, self.early_tracker
        if not plan.runs_tracker:
            if early is not None:
                early.go_pipe().close()  # it leaves without a word
                life.supervisor.release(early.child)
            return
        if early is not None:
            self.tracker = early
            early.go_pipe().send({"workers": plan.num_worker, "port": plan.tracker_port, "host": plan.tracker_argv[-1]})
            early.go_pipe().close()
            return
        self.tracker = _Tracker(life, list(plan.tracker_argv))

    def _start_runners(self, life: lifecycle.Life) -> None:
        """Every planned worker: the early runner as worker 0 when the plan has one worker per pod
        run through the runner, and the rest (or all) now, waiting for their go word."""
        plan = life.plan
        self.workers = [_Spawned(w, report_path=life.generation_path(f"worker-{w.task_id}")) for w in plan.workers]
        reuse = self.early_runner is not None and plan.runner and plan.workers_per_pod == 1
        if self.early_runner is not None and not reuse:
            _made(self.runner_go, "the early runner's go pipe").close()
            life.supervisor.release(self.early_runner)
        if reuse:
            first = self.workers[0]
            first.child, first.report_path, first.early = self.early_runner, life.path("worker-early.json"), True
        if not plan.runner:
            return
        rest = [spawned for spawned in self.workers if spawned.child is None]
        if not rest:
            return
        self.shared_go = go = life.go_pipe()
        if self.joined_pipe is None:
            self.joined_pipe = self._listen_joins(life)
        for spawned in rest:
            options = [
                "--go-fd",
                str(go.child_fd),
                "--joined-fd",
                str(self.joined_pipe.child_fd),
                "--report",
                spawned.report_path,
            ]
            self._spawn(life, spawned, options, (go, self.joined_pipe))
        go.handed()

    def _spawn(
        self,
        life: lifecycle.Life,
        spawned: _Spawned,
        options: list[str],
        keep: tuple[lifecycle.GoPipe | lifecycle.Listen, ...] = (),
    ) -> None:
        from launcher.core import settings

        worker, argv = spawned.worker, list(life.plan.argv)
        if options:  # the runner's own, between it and the program
            at = argv.index(RUNNER) + 1
            argv[at:at] = options
        transform = (lambda line, task=worker.task_id: f"[rank-{task}]: {line}") if len(self.workers) > 1 else None
        spawned.child = life.spawn(
            f"worker-{worker.task_id}",
            argv,
            {**settings.environ(), **worker.env_set, **life.runner_env()},
            keep=keep,
            transform=transform,
        )

    # --- waiting -------------------------------------------------------------------------------

    def awaits(self, life: lifecycle.Life) -> lifecycle.Awaited:
        """The tracker's name, then its port (other pods)."""
        return lifecycle.Awaited(
            resolve=life.plan.resolve,
            connect=life.plan.connect,
            cap=KNOCK_INTERVAL,
            who="the XGBoost tracker (DMLC_TRACKER_URI:DMLC_TRACKER_PORT, pod 0)",
        )

    def wait(self, life: lifecycle.Life) -> None:
        """Pod 0: its own tracker's ready word."""
        from launcher.core.outcome import WaitTimeout

        plan, supervisor, deadline = life.plan, life.supervisor, life.deadline
        if (tracker := self.tracker) is not None:
            while not tracker.ready:
                if time.monotonic() >= deadline:
                    raise WaitTimeout(
                        f"the XGBoost tracker on {plan.node} did not listen on port "
                        f"{plan.tracker_port} within {life.launcher.rendezvous_timeout:g}s"
                    )
                supervisor.sleep(max(0.0, deadline - time.monotonic()), until=lambda: tracker.ready)

    # --- going ---------------------------------------------------------------------------------

    def go(self, life: lifecycle.Life) -> None:
        _made(self.stops, "the stop board").join()
        if not life.plan.runner:
            for spawned in self.workers:
                self._spawn(life, spawned, [])
            return
        # The runners hold it now: its end of file means they all left.
        _made(self.joined_pipe, "the joined pipe").handed()
        for spawned in self.workers:
            if spawned.early:
                runner_go = _made(self.runner_go, "the early runner's go pipe")
                runner_go.send({"env": {**spawned.worker.env_set, **life.runner_env()}})
                runner_go.close()
        shared = sum(1 for spawned in self.workers if not spawned.early)
        if shared:
            shared_go = _made(self.shared_go, "the runners' go pipe")
            shared_go.send(runner_module.GO_WORD * shared)
            shared_go.close()
        self._watch_joins(life, time.monotonic() + life.launcher.rendezvous_timeout)

    def _listen_joins(self, life: lifecycle.Life) -> lifecycle.Listen:
        """This generation's pipe on which every runner writes its task id once joined (an earlier
        generation's words, read late, land in that generation's set)."""
        joined: set[int] = set()
        self.joined = joined
        return life.listen(lambda data: joined.update(int(word) for word in data.split() if word.isdigit()))

    def _watch_joins(self, life: lifecycle.Life, deadline: float) -> None:
        """Serve until every local worker has joined the tracker, or time the job out."""
        from launcher.core.outcome import Outcome, Reasons, RootCause

        expected = {spawned.worker.task_id for spawned in self.workers}
        supervisor, plan = life.supervisor, life.plan
        while not expected <= self.joined:
            if supervisor.received_signal is not None or supervisor.first_failure is not None:
                return
            if all(_made(s.child, "a worker").returncode is not None for s in self.workers):
                return
            self._post_own_failure(life)
            if time.monotonic() >= deadline:
                missing = sorted(expected - self.joined)
                self.join_timeout = Outcome.of(
                    Reasons.RENDEZVOUS_TIMEOUT,
                    f"XGBoost task(s) {', '.join(map(str, missing[:20]))} on {plan.node} did not join the tracker "
                    f"at {plan.tracker_host}:{plan.tracker_port} within "
                    f"{life.launcher.rendezvous_timeout:g}s: it waits for all DMLC_NUM_WORKER={plan.num_worker} "
                    "workers (a pod still pending, or pods that see different GPU counts?)",
                    RootCause(node=plan.node),
                )
                supervisor.begin_teardown()
                return
            supervisor.poll(min(0.5, max(0.0, deadline - time.monotonic())))

    def serve(self, life: lifecycle.Life) -> None:
        """The supervisor's loop, looking after every step for a failure to post."""
        supervisor = life.supervisor
        if not life.interrupted:
            while any(c.returncode is None for c in supervisor.children):
                supervisor.poll(SERVE_STEP)
                self._post_own_failure(life)
        supervisor.run()  # orphans, the last output

    def _post_own_failure(self, life: lifecycle.Life) -> None:
        """Once a process here failed on its own (not a worker that only lost a peer), tell the board."""
        stops = self.stops
        if stops is None or stops.posted or stops.adopted is not None:
            return
        if life.supervisor.first_failure is None and self.join_timeout is None:
            return
        stops.post(self.judge(life))

    # --- restarting in place -------------------------------------------------------------------

    # Every pod ends a generation alike through the stop board: the pod whose worker (or tracker)
    # failed on its own posts its outcome and every other adopts it, so all restart or none.
    restarts_in_place = True

    def lobby(self, life: lifecycle.Life) -> Place | None:
        """Pod 0's, at the tracker's address, the first port above every generation's tracker and
        board; where the launcher runs the tracker."""
        from launcher.core.lobby import Place
        from launcher.xgboost.plan import PORTS_PER_GENERATION

        plan = life.plan
        if plan.tracker_by != "launcher":
            return None
        port = lifecycle.lobby_port(plan.tracker_port, life.max_restarts, "the tracker's port", PORTS_PER_GENERATION)
        return Place(plan.tracker_host, port, plan.pods, plan.pod_index)

    def restarts_after(self, life: lifecycle.Life, outcome: Outcome) -> bool:
        """Not after its workers never all joined (RendezvousTimeout): a pod that starts late starts
        from the first generation, on the first generation's tracker port. A lost pod only where its
        replacement can rejoin (lifecycle.rejoins). Those end as before (138) and Kubernetes starts
        every pod again."""
        from launcher.core.outcome import Reasons

        reasons = (outcome.reason, outcome.extra.get("causeReason"))
        return lifecycle.rejoins(life, outcome) and Reasons.RENDEZVOUS_TIMEOUT not in reasons

    def restart(self, life: lifecycle.Life) -> None:
        """Every process of the last generation is gone: plan this one (its tracker and board on
        ports of their own); :meth:`start` then starts the board, pod 0's tracker and every worker."""
        plan = make_plan(self.xgboost_overrides, self.rest, life.launcher, generation=life.generation)
        if life.planned is not None:
            life.planned = replace(life.planned, plan=plan, summary=_summary(plan))
        self._close_stops()
        self.early_tracker = self.tracker = None
        self.early_runner = self.runner_go = self.shared_go = self.joined_pipe = None
        self.workers, self.joined, self.join_timeout = [], set(), None

    def _close_stops(self) -> None:
        if self.stops is not None:
            self.stops.close()
            self.stops = None

    # --- judging -------------------------------------------------------------------------------

    def conclude(self, life: lifecycle.Life, own: Outcome) -> Outcome:
        if life.interrupted or self.stops is None:
            return own
        self._post_own_failure(life)
        return self.stops.settle(own)

    def judge(self, life: lifecycle.Life) -> Outcome:
        """This pod's own outcome, from what has happened so far."""
        from launcher.core.outcome import Outcome, Reasons, RootCause, last_lines, success, terminated

        supervisor, node = life.supervisor, life.node
        if life.watch is not None and life.watch.hang is not None:
            return life.watch.hang
        if self.join_timeout is not None:
            return self.join_timeout
        first = supervisor.first_failure
        if first is None:
            if supervisor.received_signal is not None:
                return terminated(supervisor.received_signal).on_node(node)
            return success()
        codes = life.launcher.retryable_exit_codes
        if any(tracker is not None and first is tracker.child for tracker in (self.tracker, self.early_tracker)):
            if refused := _tracker_refused(first):
                return Outcome.of(Reasons.CONFIG_ERROR, refused, RootCause(node=node))
            evidence = judge.gather(first.exit_status, first.marks, memory_before=life.memory)
            outcome = judge.verdict(
                evidence, codes=codes, root_cause=RootCause(node=node), what=f"the XGBoost tracker on {node}"
            )
            return outcome.with_extra(**last_lines(first.tail))
        spawned = self._root_worker(first)
        if spawned is None:  # a runner the plan had sent away: it failed before its go word
            evidence = judge.gather(first.exit_status, first.marks, memory_before=life.memory)
            early = judge.verdict(evidence, codes=codes, what=f"the XGBoost worker started early on {node}")
            return early.with_extra(**last_lines(first.tail)).on_node(node)
        return self._worker_outcome(life, spawned)

    def _root_worker(self, first: Child) -> _Spawned | None:
        """The worker that failed on its own: the first to fail, unless it only lost a peer and a
        neighbour on this pod failed on its own a moment later."""
        spawned = next((s for s in self.workers if s.child is first), None)
        if spawned is None or not _peer_lost(spawned, records.Report.read(spawned.report_path)):
            return spawned
        failed = [s for s in self.workers if s.child is not None and s.child.returncode not in (0, None)]
        reports = {id(s): records.Report.read(s.report_path) for s in failed}
        own = [s for s in failed if reports[id(s)] is not None and not _peer_lost(s, reports[id(s)])]
        return min(own, key=_exited_at) if own else spawned

    def _worker_outcome(self, life: lifecycle.Life, spawned: _Spawned) -> Outcome:
        from launcher.core.outcome import Outcome, Reasons, RootCause, internal_error, last_lines, signal_name

        child, worker, node = _made(spawned.child, "a worker"), spawned.worker, life.node
        returncode = child.exit_status
        cause = RootCause(
            node=node,
            rank=worker.task_id,
            local_rank=worker.local_rank,
            exit_code=returncode if returncode > 0 else None,
            signal=signal_name(-returncode) if returncode < 0 else None,
        )
        what = f"XGBoost worker (task {worker.task_id}) on {node}"
        report = records.Report.read(spawned.report_path)
        error = report.error if report is not None else None
        if report is not None and report.ending == "crashed" and error:
            # The runner's own bug, not the program's failure (launcher/core/crash.py).
            return internal_error(error, report.where, node)
        refused = Reasons.named(report.reason or "") if report is not None and report.ending == "refused" else None
        if refused in (Reasons.UNSUPPORTED_VERSION, Reasons.CONFIG_ERROR) and error:
            # The runner refused the interpreter's xgboost: out of range, before importing it
            # (launcher/core/versions.py), or not importable at all.
            return Outcome.of(refused, f"{what}: {error}", cause)
        if _peer_lost(spawned, report):
            # Worded so launcher.core.job_outcome (PEER_LOSS_PATTERN) never takes this pod for the
            # job's root cause: xgboost's own words ("Encountered EOF. The other end is likely
            # closed.") say the same thing, but not in the pattern's.
            said = error or _peer_loss_line(child)
            outcome = Outcome.of(
                Reasons.PEER_LOST,
                f"{what} lost a peer: a worker on another pod failed or went away, or the tracker did",
                cause,
                evidence=f"connection closed by peer: {said}"[:500],
            )
        else:
            evidence = judge.gather(returncode, child.marks, memory_before=life.memory)
            outcome = judge.verdict(evidence, codes=life.launcher.retryable_exit_codes, root_cause=cause, what=what)
        if error:
            outcome = outcome.with_extra(error=error)
        return outcome.with_extra(**last_lines(child.tail))


_T = TypeVar("_T")


def _made(value: _T | None, what: str) -> _T:
    """``value``, which an earlier step of the pod's life made: a clear error where it did not."""
    if value is None:
        raise RuntimeError(f"xgboost: {what} is used before it was made")
    return value


def _peer_lost(spawned: _Spawned, report: records.Report | None) -> bool:
    """Whether the worker failed because a peer went away: as its ``report`` says, else (program
    mode, or killed) as xgboost's last words do."""
    if report is not None:
        return report.ending == "peerLost"
    return bool(runner_module.PEER_LOSS.search("\n".join(_made(spawned.child, "a worker").tail)))


def _exited_at(spawned: _Spawned) -> float:
    """When an exited worker exited."""
    exited_at = _made(spawned.child, "a worker").exited_at
    return math.inf if exited_at is None else exited_at


def _peer_loss_line(child: Child) -> str:
    return next(
        (line.strip() for line in reversed(child.tail) if runner_module.PEER_LOSS.search(line)),
        "the collective's connection failed",
    )


def _tracker_refused(child: Child) -> str | None:
    """The tracker's one line when the program's python cannot import xgboost (it exits 2)."""
    if child.exit_status != 2:
        return None
    said = next((line for line in reversed(child.tail) if tracker_module.CANNOT_IMPORT in line), None)
    return said.strip().removeprefix(tracker_module.SAYS) if said else None
