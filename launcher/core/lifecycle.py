"""The pod's life, written once. Every framework's pod walks the same steps, in this order:

    start early ─► settings ─► plan ─► watch ─► start ─► wait for peers ─► go ─► serve ─► judge
        ─► conclude ─► export ─► deliver

A framework supplies a :class:`Pod`: what it starts before the launcher validates (processes whose
slow ``import`` overlaps ours, each held by a go pipe), its plan, its wait, its go word, how it
judges its children and what it settles with the other pods. :func:`live` does the rest, the same
way for all of them: the supervisor and its knobs, the plan's log line, the status watch and its
variables, the go pipes closed on every path (a child whose pipe closes without a word leaves
quietly), a wait that times out, teardown, the watch's verdict on a hang, delivery.

``core`` imports nothing above it: the status watch comes in as a :data:`StartWatch`.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from launcher.core import memory
from launcher.core.supervisor import Child, Interrupted, Supervisor

if TYPE_CHECKING:
    from launcher.core.lobby import Lobby, Place
    from launcher.core.outcome import LauncherError, Outcome
    from launcher.core.settings import LauncherSettings, Override


class JobWatch(Protocol):
    """What the lifecycle needs of whoever watches the job's progress (the status services)."""

    hang: Outcome | None  # set when the watch ended the job as hung: that is its outcome
    # How a hang's stacks are taken: this pod's ranks, unless the framework can ask every node.
    take_stacks: Callable[[], list]

    @property
    def watch(self) -> object | None:
        """What watches for hangs; None: hangs are not watched."""

    def rank_env(self) -> dict[str, str]:
        """The variables the job's processes need to report to the watch."""

    def restarted(self, generation: int) -> None:
        """The job's processes start again in place (``generation``: how many restarts so far):
        the status carries the count, and a hang is looked for afresh."""

    def done(self) -> None:
        """The job's processes are gone: stop watching them (the final status goes out on delivery)."""

    def report(self, metrics: list[tuple[str, str]]) -> None:
        """After the job, before its outcome: these metrics now (an export's progress)."""

    def close(self) -> None:
        """After delivery: nothing more to send."""


class RestartAgent(Protocol):
    """What the lifecycle needs of JobSet's in-place restart agent (launcher.k8s.inplace): a
    barrier before the job's processes go, a word when the JobSet asks every pod to restart its
    container, and the exit code that has the kubelet do it."""

    exit_code: int

    def barrier(self, sleep: Callable[[float], None], deadline: float) -> None: ...

    def restart_requested(self) -> bool: ...

    def close(self) -> None: ...


# The agent from the pod's environment, or None: the pod's JobSet does not restart in place.
InPlace = Callable[[Mapping[str, str]], "RestartAgent | None"]

# Starts the watch of this pod's job, once it is planned (what it needs is in ``life.planned``), or
# says None: nothing to watch.
StartWatch = Callable[["Life"], "JobWatch | None"]


class Export(Protocol):
    """What the lifecycle needs of the step that uploads the job's output (launcher.export)."""

    def check(self, life: Life) -> None:
        """With the plan: refuse bad settings (a LauncherError) before anything starts."""

    def after(self, life: Life, outcome: Outcome) -> Outcome:
        """After the job, before delivery: export if asked, and say the outcome that results."""


class Plan(Protocol):
    """A framework's frozen plan, as the lifecycle logs it."""

    def to_json(self) -> dict: ...


@dataclass(frozen=True)
class Planned:
    """What a pod's plan hook gives the lifecycle."""

    plan: Plan | None  # the framework's frozen plan
    node: str  # this pod's name, in outcomes and status
    summary: str  # the plan's one log line ("": none)
    sends: bool = False  # this pod reports the job to the status server (one sender per job)
    watch: dict = field(default_factory=dict)  # more for the status watch (launcher.status.monitor.start)
    # The framework's own word for LAUNCHER_MAX_RESTARTS (torchrun's --max-restarts), when the
    # launcher's knob is left at 0; None: it has none.
    max_restarts: int | None = None


@dataclass(frozen=True)
class Awaited:
    """What a pod waits for before its go word, as its plan describes it. The lifecycle does the
    waiting: its deadline (``LAUNCHER_RENDEZVOUS_TIMEOUT`` from the start of the wait), its
    backoff on the supervisor's sleep (a signal ends it), its log lines and its timeout's message."""

    resolve: str | None = None  # a name that must resolve
    connect: tuple[str, int] | None = None  # then a host:port that must accept TCP
    hosts: tuple[str, ...] = ()  # every one of these must resolve and accept TCP on ``port``
    port: int = 0
    cap: float | None = None  # the longest pause between two looks (None: the usual backoff)
    who: str | None = None  # what they are, for the timeout's message ("the tracker (pod 0)")


class _Pipe:
    """One pipe between this launcher and its children: ``child_fd`` is their end until handed."""

    child_fd = -1

    def handed(self) -> None:
        """The children hold their end now: drop ours (their end of file comes from us alone)."""
        if self.child_fd != -1:
            os.close(self.child_fd)
            self.child_fd = -1


class GoPipe(_Pipe):
    """A pipe to a child that waits for its go word: JSON lines (or raw words) until closed. A
    child that reads end of file without a word leaves at once, quietly. A gone child is no error
    here: the supervisor sees it exit."""

    def __init__(self) -> None:
        self.child_fd, self.fd = os.pipe()

    def send(self, message: dict | bytes) -> None:
        if self.fd == -1:
            return
        data = message if isinstance(message, bytes) else json.dumps(message).encode() + b"\n"
        try:
            os.write(self.fd, data)
        except BrokenPipeError:
            self.close()

    def close(self) -> None:
        self.handed()
        if self.fd != -1:
            os.close(self.fd)
            self.fd = -1


class Listen(_Pipe):
    """A pipe children write to and the supervisor's loop reads: ``on_data`` gets each read, and
    ``b""`` once every writer is gone (then the pipe is closed)."""

    def __init__(self, supervisor: Supervisor, on_data: Callable[[bytes], None], size: int = 65536) -> None:
        self.fd, self.child_fd = os.pipe()
        self.supervisor, self.on_data, self.size = supervisor, on_data, size
        supervisor.watch(self.fd, self._readable)

    def _readable(self) -> None:
        data = os.read(self.fd, self.size)
        if not data:
            self.close()
        self.on_data(data)

    def close(self) -> None:
        self.handed()
        if self.fd != -1:
            self.supervisor.unwatch(self.fd)
            os.close(self.fd)
            self.fd = -1


class Life:
    """One pod's run: what every hook is handed. ``launcher``, ``planned`` and ``watch`` fill in as
    the steps pass; ``workdir`` is private to this run and removed at its end."""

    def __init__(self, supervisor: Supervisor, name: str, overrides: dict[str, Override] | None = None) -> None:
        self.supervisor = supervisor
        self.overrides = overrides or {}  # the flags given, by knob name (launcher.core.knobs.given)
        self.workdir = tempfile.mkdtemp(prefix=f"trainer-launcher-{name}-")
        self._launcher: LauncherSettings | None = None
        self.planned: Planned | None = None
        self.watch: JobWatch | None = None
        self.watched: dict[str, str] = {}  # the watch's variables for the job's processes
        self.interrupted = False  # the wait was cut short by a signal or an early exit
        self.deadline = 0.0  # of the wait for the peers (monotonic), set as each generation starts
        # Which start of the job's processes this is: 0, then one more at each restart in place.
        self.generation = 0
        self.history: list[Outcome] = []  # how each earlier generation ended
        self.max_restarts = 0  # LAUNCHER_MAX_RESTARTS, or the framework's word for it (Planned)
        self.in_place: RestartAgent | None = None  # JobSet's in-place restart, where the runtime uses it
        self.lobby: Lobby | None = None  # where the pods agree on each generation, where a lost pod may rejoin
        self.restart_asked = False  # the JobSet asked this generation's pods to restart their containers
        # The container's memory cgroup before the job: the judge compares the kernel's OOM count.
        self.memory = memory.read()
        self._pipes: list[GoPipe | Listen] = []
        self._closing: list[Callable[[], None]] = []

    @property
    def launcher(self) -> LauncherSettings:
        """The launcher's settings, loaded before :meth:`Pod.plan` (only ``start_early`` runs before)."""
        if self._launcher is None:
            raise RuntimeError("the launcher's settings are read before they were loaded (in start_early?)")
        return self._launcher

    @launcher.setter
    def launcher(self, settings: LauncherSettings) -> None:
        self._launcher = settings

    @property
    def plan(self):
        return self.planned.plan if self.planned is not None else None

    @property
    def node(self) -> str:
        return self.planned.node if self.planned is not None else socket.gethostname()

    def path(self, name: str) -> str:
        return os.path.join(self.workdir, name)

    def generation_path(self, name: str, generation: int | None = None) -> str:
        """File ``name`` (JSON) of generation ``generation``, this one's by default: the first
        start's is ``name.json``, a restart's ``name-<g>.json``, so that an earlier generation's late
        write never speaks for a later one."""
        generation = self.generation if generation is None else generation
        return self.path(f"{name}-{generation}.json" if generation else f"{name}.json")

    def runner_env(self) -> dict[str, str]:
        """What a runner (launcher/runner/) gets with its go word beside the plan's: the watch's
        variables, the restart count, and ``--allow-untested-versions``, since its version gate
        reads only the variable."""
        allowed = self._launcher is not None and self._launcher.allow_untested_versions
        return {
            **self.watched,
            **restart_env(self.generation),
            **({"LAUNCHER_ALLOW_UNTESTED_VERSIONS": "1"} if allowed else {}),
        }

    def go_pipe(self) -> GoPipe:
        pipe = GoPipe()
        self._pipes.append(pipe)
        return pipe

    def listen(self, on_data: Callable[[bytes], None], size: int = 65536) -> Listen:
        pipe = Listen(self.supervisor, on_data, size)
        self._pipes.append(pipe)
        return pipe

    def spawn(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str] | None = None,
        pipes: tuple[GoPipe | Listen, ...] = (),
        keep: tuple[GoPipe | Listen, ...] = (),
        transform: Callable[[str], str] | None = None,
        standby: bool = False,
    ) -> Child:
        """Start ``argv`` under the supervisor with ``pipes`` (and ``keep``) as its own; ``pipes``
        are handed over, ``keep`` stay ours to pass to more children. ``standby``: it waits for the
        job's next generation (Supervisor.spawn)."""
        fds = tuple(pipe.child_fd for pipe in (*pipes, *keep))
        child = self.supervisor.spawn(name, argv, env, pass_fds=fds, transform=transform, standby=standby)
        for pipe in pipes:
            pipe.handed()
        return child

    def stop_waiting(self) -> None:
        """Every go pipe closes unsaid: whoever waits on one leaves without a word."""
        for pipe in self._pipes:
            if isinstance(pipe, GoPipe):
                pipe.close()

    def stopping(self) -> bool:
        """A signal stopped the job, or a process failed: no go word from here on."""
        return self.supervisor.received_signal is not None or self.supervisor.first_failure is not None

    def closing(self, close: Callable[[], None]) -> None:
        """Call ``close`` at the end of the run, after delivery."""
        self._closing.append(close)

    def close(self) -> None:
        for pipe in self._pipes:
            pipe.close()
        for close in self._closing:
            close()
        if self.watch is not None:
            self.watch.close()  # after delivery: its final status has gone out
        shutil.rmtree(self.workdir, ignore_errors=True)


# What the job's processes read to know which start in place of the job they are.
RESTART_COUNT_ENV = "LAUNCHER_RESTART_COUNT"


def restart_env(generation: int) -> dict[str, str]:
    """The job's processes' :data:`RESTART_COUNT_ENV`: ``generation``."""
    return {RESTART_COUNT_ENV: str(generation)}


def generation_port(port: int, generation: int, name: str, given: str | None = None, step: int = 1) -> int:
    """The port of the job's ``generation``-th start in place: ``generation`` x ``step`` above the
    first one's, so that no process joins the last generation's service (``name``: the setting that
    gave it, ``given``: its value, where that is more than the port). ``step``: the ports each
    generation takes from its first on (a service beside the main one), all of which must fit."""
    from launcher.core.outcome import ConfigError

    if port + generation * step + step - 1 > 65535:
        each = f", {step} ports each" if step > 1 else ""
        expected = f"a port with room for {generation} restarts above it{each} (up to 65535)"
        raise ConfigError(name, given or str(port), expected)
    return port + generation * step


def lobby_port(port: int, max_restarts: int, name: str, step: int = 1) -> int:
    """The job's lobby's port (launcher.core.lobby): the first above every generation's, which
    start at ``port``, ``step`` apart (``name``: the setting that gave ``port``)."""
    return generation_port(port, max_restarts + 1, name, step=step)


class Pod:
    """A framework's part of the pod's life. Only :meth:`plan` and :meth:`judge` must be given."""

    name = "job"

    def start_early(self, life: Life) -> None:
        """Start what imports slowly, before the launcher loads anything heavy: each held by a go
        pipe (:meth:`Life.go_pipe`) until :meth:`go`."""

    def plan(self, life: Life) -> Planned:
        """Validate and plan (``life.launcher`` is loaded); a LauncherError is the pod's outcome."""
        raise NotImplementedError

    def check_workspace(self, life: Life) -> None:
        """Warn, in one line, when the job cannot write where it will (the plan is made)."""
        from launcher.core import workspace

        workspace.warn_if_unwritable()

    def start(self, life: Life) -> None:
        """Start what the plan asks for before the wait (the rest comes with :meth:`go`)."""

    def awaits(self, life: Life) -> Awaited | None:
        """The names and ports to wait for before the go word (the lifecycle waits); None: none."""
        return None

    def wait(self, life: Life) -> None:
        """What else to wait for once :meth:`awaits` is through, before ``life.deadline``, serving the
        supervisor (``supervisor.sleep``): Interrupted when the job stops meanwhile, a LauncherError
        (say WaitTimeout) when it never came."""

    def wait_failed(self, life: Life, error: LauncherError) -> Outcome:
        """The outcome of a wait that failed, once everything started is gone."""
        return error.outcome().on_node(life.node)

    def go(self, life: Life) -> None:
        """Let the job run: the go words, or the processes started now."""

    def serve(self, life: Life) -> None:
        """Serve until the job's processes are gone."""
        life.supervisor.run()

    def judge(self, life: Life) -> Outcome:
        """This pod's outcome from how its processes ended."""
        raise NotImplementedError

    def conclude(self, life: Life, own: Outcome) -> Outcome:
        """Settle with the other pods: the job's outcome as this pod reports it."""
        return own

    # Whether this framework starts its processes again in place (LAUNCHER_MAX_RESTARTS). Every
    # pod of the job ends a generation with the same outcome (conclude), so all of them restart, or
    # none; what the next generation needs afresh (ports, store keys, processes) follows from
    # ``life.generation``.
    restarts_in_place = False

    def restart(self, life: Life) -> None:
        """Every process of the last generation is gone: get ready for ``life.generation``, whose
        :meth:`start`, wait and :meth:`go` come next, as the first one's did."""

    def restarts_after(self, life: Life, outcome: Outcome) -> bool:
        """Whether the job starts again in place after this retryable ending (restarts left): what
        the framework's reasons mean may say otherwise. By default, after a lost pod only where its
        replacement can rejoin (:func:`rejoins`)."""
        return rejoins(life, outcome)

    def lobby(self, life: Life) -> Place | None:
        """Where this job's pods agree on each generation (launcher.core.lobby): pod 0's address
        and a port above every generation's. None: this framework's pods cannot rejoin."""
        return None


def rejoins(life: Life, outcome: Outcome) -> bool:
    """Whether a pod lost in the last generation (PeerLost) can come back into the next one: the job
    has a lobby where its replacement finds the generation. Any other ending: True."""
    from launcher.core.outcome import Reasons

    return life.lobby is not None or Reasons.PEER_LOST not in (outcome.reason, outcome.extra.get("causeReason"))


def live(
    pod: Pod,
    launcher_overrides: dict[str, Override],
    start_watch: StartWatch | None = None,
    export: Export | None = None,
    in_place: InPlace | None = None,
) -> int:
    """Walk ``pod`` through its life; deliver its outcome; return the exit code. ``in_place``: the
    pod's agent of JobSet's in-place restart, from its environment (launcher.k8s)."""
    with Supervisor() as supervisor:
        life = Life(supervisor, pod.name, launcher_overrides)
        try:
            pod.start_early(life)
            from launcher.core.report import run_command  # pydantic: while the early ones import

            return run_command(
                launcher_overrides, lambda launcher: _walk(pod, life, launcher, start_watch, export, in_place)
            )
        finally:
            life.stop_waiting()
            life.close()


def _walk(
    pod: Pod,
    life: Life,
    launcher: LauncherSettings,
    start_watch: StartWatch | None,
    export: Export | None,
    in_place: InPlace | None = None,
) -> Outcome:
    from launcher.core import log
    from launcher.core.outcome import LauncherError, evidence_regex

    supervisor = life.supervisor
    life.launcher = launcher
    supervisor.grace_period = launcher.grace_period
    supervisor.evidence = evidence_regex(launcher.retryable_pattern)
    try:
        life.planned = planned = pod.plan(life)
        life.max_restarts = _max_restarts(pod, life, planned)
        life.lobby = _lobby(pod, life)
        if in_place is not None:
            life.in_place = _restart_agent(in_place, life)
        if export is not None:
            export.check(life)
    except LauncherError as error:
        life.stop_waiting()  # only the launcher's own line is said
        return error.outcome().on_node(life.node)
    pod.check_workspace(life)
    if planned.summary:
        log.info(planned.summary, **({"plan": planned.plan.to_json()} if planned.plan is not None else {}))
    if start_watch is not None:
        # Progress, the TrainJob's status (one pod sends) and hangs.
        life.watch = start_watch(life)
        if life.watch is not None:
            life.watched = life.watch.rank_env()
    outcome, ran = _generation(pod, life)
    while ran and _restart_due(pod, life, outcome):
        _restart(pod, life, outcome)
        outcome, ran = _generation(pod, life)
    if life.history:
        outcome = outcome.with_extra(restarts=restart_history(life.history))
    return export.after(life, outcome) if export is not None else outcome


def _generation(pod: Pod, life: Life) -> tuple[Outcome, bool]:
    """One start of the job's processes, to its outcome: start, wait for the peers, go, serve,
    judge, conclude. Also says whether the processes ran (False: the wait for the peers failed)."""
    from launcher.core.outcome import LauncherError

    supervisor = life.supervisor
    try:
        if life.lobby is not None:
            _check_in(pod, life)
        life.deadline = time.monotonic() + life.launcher.rendezvous_timeout
        pod.start(life)
        awaited = pod.awaits(life)
        if awaited is not None:
            _await(life, awaited)
        pod.wait(life)
        if life.in_place is not None:
            life.in_place.barrier(supervisor.sleep, life.deadline)
    except Interrupted:
        life.interrupted = True  # judged below
        life.stop_waiting()
    except LauncherError as error:
        life.stop_waiting()
        supervisor.kill_all()
        supervisor.run()
        return pod.wait_failed(life, error), False
    if not life.interrupted and not life.stopping() and not _restart_asked(life):
        pod.go(life)
    pod.serve(life)
    last = not _may_restart(life)
    if life.watch is not None and last:
        life.watch.done()
    own = pod.judge(life)
    if life.watch is not None and life.watch.hang is not None:
        own = life.watch.hang  # the watch ended the job as hung: the exits are its teardown
    if life.restart_asked and life.in_place is not None:
        from launcher.core.outcome import Outcome, Reasons, RootCause

        said = "the JobSet asked every pod to restart its container in place; the job's processes were stopped"
        code = life.in_place.exit_code
        return Outcome.of(Reasons.RESTART_ASKED, said, RootCause(node=life.node), exit_code=code), False
    return pod.conclude(life, own), True


def _restart_agent(in_place: InPlace, life: Life) -> RestartAgent | None:
    """The pod's in-place restart agent, with an exit code the runtimes restart a container on."""
    from launcher.core.outcome import ConfigError

    agent = in_place(os.environ)
    if agent is None:
        return None
    life.closing(agent.close)
    codes = life.launcher.retryable_exit_codes
    if agent.exit_code not in codes:
        expected = f"one of the retryable exit codes {','.join(map(str, sorted(codes)))}"
        raise ConfigError("IN_PLACE_RESTART_EXIT_CODE", str(agent.exit_code), expected)

    def tick() -> None:
        _restart_asked(life)

    life.supervisor.tickers.append(tick)
    return agent


def _restart_asked(life: Life) -> bool:
    """Whether the JobSet asked every pod to restart its container in place; the first time it
    is seen, this generation's processes are told to stop (their grace period, as on SIGTERM)."""
    agent = life.in_place
    if agent is None or life.restart_asked or not agent.restart_requested():
        return life.restart_asked
    from launcher.core import log

    life.restart_asked = True
    log.warning("the JobSet asks every pod to restart in place: stopping the job's processes")
    life.stop_waiting()
    life.supervisor.begin_teardown()
    return True


def _lobby(pod: Pod, life: Life) -> Lobby | None:
    """The job's lobby, where restarts are on and a lost pod may rejoin (LAUNCHER_REJOIN_TIMEOUT);
    pod 0 serves it from now on."""
    from launcher.core.lobby import Lobby
    from launcher.core.outcome import ConfigError

    if not life.max_restarts or life.launcher.rejoin_timeout <= 0:
        return None
    place = pod.lobby(life)
    if place is None or place.nnodes < 2:
        return None
    lobby = Lobby(place, life.node)
    try:
        lobby.serve()
    except OSError as error:
        expected = f"a free port on pod 0 for the job's lobby, the first above every generation's ({error.strerror})"
        raise ConfigError("the lobby's port", place.port, expected) from None
    life.closing(lobby.close)
    return lobby


def _check_in(pod: Pod, life: Life) -> None:
    """Agree with the other pods on the generation to start. A pod that finds the others at a later
    one (it replaces a lost pod) sends away what it started for its own and joins theirs."""
    from launcher.core import log

    lobby, launcher = life.lobby, life.launcher
    assert lobby is not None
    restarting = life.generation > 0
    timeout = launcher.rejoin_timeout if restarting else launcher.rendezvous_timeout
    while (agreed := lobby.agree(life.generation, timeout, life.supervisor.sleep, restarting)) > life.generation:
        if agreed > life.max_restarts:
            from launcher.core.lobby import Missing

            said = f"the other pods have no restart left (their {life.max_restarts}) to take {life.node} in"
            raise Missing(said, life.node, True)
        log.warning(
            f"rejoining the job at restart {agreed} of {life.max_restarts}: this pod replaces a lost one, and "
            "the other pods start that restart in place with it"
        )
        life.stop_waiting()  # what started ahead for the generation it skips leaves at once
        life.supervisor.run()
        life.generation = agreed
        life.supervisor.next_generation()
        pod.restart(life)
    if life.generation and life.watch is not None:
        life.watch.restarted(life.generation)  # the hold was no start-up: a hang is timed from now


def _max_restarts(pod: Pod, life: Life, planned: Planned) -> int:
    """LAUNCHER_MAX_RESTARTS, or where it is 0 the framework's own word for it; refused (a bad
    value, exit 2) by a framework that cannot restart in place."""
    from launcher.core.outcome import ConfigError

    count = life.launcher.max_restarts or planned.max_restarts or 0
    if count and not pod.restarts_in_place:
        given = life.overrides.get("max_restarts")
        name = given.source if given is not None else "LAUNCHER_MAX_RESTARTS"
        raise ConfigError(name, str(count), f"0: {pod.name} jobs do not restart in place yet")
    return count


def _may_restart(life: Life) -> bool:
    """Restarts are left and nobody asked the pod to stop (a signal: Kubernetes is ending it)."""
    return life.generation < life.max_restarts and life.supervisor.received_signal is None


def _restart_due(pod: Pod, life: Life, outcome: Outcome) -> bool:
    """The job failed retryably (the one table says so), may start again in place, and the pod
    can start it so (Pod.restarts_after)."""
    from launcher.core.reasons import is_retryable

    codes = life.launcher.retryable_exit_codes
    if outcome.exit_code == 0 or not is_retryable(outcome.exit_code, codes) or not _may_restart(life):
        return False
    return pod.restarts_after(life, outcome)


def _restart(pod: Pod, life: Life, outcome: Outcome) -> None:
    """Every pod came to the same retryable outcome: start generation + 1 in place."""
    from launcher.core import log

    life.history.append(outcome)
    life.generation += 1
    life.interrupted = False
    cause = outcome.root_cause
    where = cause.node if cause is not None and cause.node else life.node
    if cause is not None and cause.rank is not None:
        where = f"rank {cause.rank} on {where}"
    reason = outcome.extra.get("causeReason") or outcome.reason  # PeerFailed: the root's own, as every pod says
    log.warning(
        f"restart {life.generation} of {life.max_restarts}: the job failed retryably "
        f"({reason}, exit {outcome.exit_code}, {where}): {outcome.message}; "
        "starting every process again in place"
    )
    life.supervisor.next_generation()
    if life.watch is not None:
        life.watch.hang = None  # a hang is a generation's: the next one is watched afresh
        life.watch.restarted(life.generation)
    pod.restart(life)


# The termination message keeps the last this many generations' causes (it holds 4096 bytes).
HISTORY_KEPT = 8


def restart_history(history: list[Outcome]) -> list[dict]:
    """Each earlier generation's ending, oldest first, for the termination message."""
    kept = []
    for generation, outcome in list(enumerate(history))[-HISTORY_KEPT:]:
        reason = outcome.extra.get("causeReason") or outcome.reason
        entry: dict = {"generation": generation, "reason": reason, "exitCode": outcome.exit_code}
        if outcome.root_cause is not None:
            entry["rootCause"] = outcome.root_cause.to_json()
        kept.append(entry)
    return kept


def _await(life: Life, awaited: Awaited) -> None:
    """Wait for what the pod's plan names, on the supervisor's sleep, until ``life.deadline``."""
    from launcher.core import log, netwait
    from launcher.core.outcome import WaitTimeout

    supervisor, deadline, cap = life.supervisor, life.deadline, awaited.cap

    def sleep(seconds: float) -> None:
        supervisor.sleep(seconds if cap is None else min(seconds, cap))

    try:
        if awaited.resolve:
            netwait.wait_until_resolves(awaited.resolve, deadline, sleep, log.info)
        if awaited.connect:
            netwait.wait_until_accepts(*awaited.connect, deadline, sleep, log.info)
        if awaited.hosts:
            netwait.wait_until_hosts_accept(awaited.hosts, awaited.port, deadline, sleep, log.info)
    except WaitTimeout as error:
        if awaited.who is None:
            raise
        timeout = life.launcher.rendezvous_timeout
        raise WaitTimeout(f"{awaited.who} never came up within {timeout:g}s: {error}") from None
