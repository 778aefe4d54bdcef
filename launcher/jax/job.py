"""``trainer-launcher jax``: JAX's part of the pod's life (launcher/core/lifecycle.py): JAX_* -> plan ->
wait for the coordinator -> the process -> outcome.

A ``python ...`` program is started first thing, through the runner (launcher/jax/run.py), before
this process imports anything heavy (pydantic included): its ``import jax`` overlaps the
launcher's validation and its wait for the coordinator. The runner does nothing further until
the launcher's go word (one JSON line on a pipe: the variables to add, where to report); if the
launcher closes the pipe without a word (bad input, a signal, a plan without the runner) the
runner exits 0 at once, silently. Any other program starts after the wait.
"""

from __future__ import annotations

import os
import re
from dataclasses import replace
from typing import TYPE_CHECKING

from launcher import k8s, status
from launcher.core import judge, lifecycle, memory, python_argv
from launcher.core.supervisor import Child, Supervisor
from launcher.export.step import Export
from launcher.jax.plan import REPORT_ENV, runner_argv
from launcher.runner import report as records

if TYPE_CHECKING:
    from launcher.core.lobby import Place
    from launcher.core.outcome import Outcome, WaitTimeout
    from launcher.core.settings import LauncherSettings, Override
    from launcher.jax.plan import JaxPlan

RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "run.py")
PROBE_CAP = 0.25  # seconds between looks at the coordinator; a few per second per pod
_OFF = ("0", "false", "no", "off")
# What JAX prints before it aborts a process (SIGABRT) whose coordination service reported an error:
# another process died, or the service host is gone.
_SERVICE_FATAL = re.compile(r"JAX distributed service detected fatal errors")
# A second process registered under the same process id (JAX aborts the earlier one).
_DUPLICATE_ID = re.compile(r"ALREADY_EXISTS: Aborted connect attempt|newer incarnation")


def _early_command(jax_overrides: dict[str, Override], rest: list[str]) -> python_argv.PythonCommand | None:
    """The Python program to start now, before validation; None for anything else or when the
    flag turned the runner off (the variable is read later, with the rest: a runner started for
    nothing then exits at once)."""
    flag = jax_overrides.get("initialize")
    if flag is not None and str(flag.value).strip().lower() in _OFF:
        return None
    return python_argv.parse(rest)


def run_jax(launcher_overrides: dict[str, Override], jax_overrides: dict[str, Override], rest: list[str]) -> int:
    return lifecycle.live(
        JaxPod(jax_overrides, rest), launcher_overrides, status.start_watch, Export(), k8s.in_place_restart
    )


class JaxPod(lifecycle.Pod):
    """One JAX process per pod: the runner started early, or the program after the wait."""

    name = "jax"

    def __init__(self, jax_overrides: dict[str, Override], rest: list[str]):
        self.jax_overrides, self.rest = jax_overrides, rest
        self.runner: Child | None = None  # started early, waiting for its go word
        self.go_word: lifecycle.GoPipe | None = None
        self.child: Child | None = None

    def start_early(self, life: lifecycle.Life) -> None:
        command = _early_command(self.jax_overrides, self.rest)
        if command is not None:
            self._spawn_runner(life, command)

    def _spawn_runner(self, life: lifecycle.Life, command: python_argv.PythonCommand) -> None:
        """This generation's runner, held on its go pipe while the launcher waits for the coordinator."""
        self.go_word = life.go_pipe()
        argv = list(runner_argv(command, RUNNER))
        at = argv.index(RUNNER) + 1
        self.runner = life.spawn(
            "jax", [*argv[:at], "--go-fd", str(self.go_word.child_fd), *argv[at:]], pipes=(self.go_word,)
        )

    def plan(self, life: lifecycle.Life) -> lifecycle.Planned:
        plan = make_plan(self.jax_overrides, self.rest, life.launcher)
        if self.runner is not None and self.go_word is not None and not plan.runner:
            self.go_word.close()  # the runner leaves at once; the program starts after the wait
            life.supervisor.release(self.runner)
            self.runner = None
        return lifecycle.Planned(plan, plan.node, _summary(plan), sends=plan.process_id == 0)

    # Every pod concludes a generation alike through the stop record (launcher/jax/run.py): the
    # process that failed first publishes it and every other adopts its exit code, so the same
    # verdict, retryable or not, ends every pod; a process that vanished without a word (SIGKILL,
    # OOM) leaves its peers PeerLost, 138, retryable as the kill's 137 is. One that vanished with a
    # permanent code (a segfault) is the exception: its peers restart, its pod's exit fails the job.
    restarts_in_place = True

    def restart(self, life: lifecycle.Life) -> None:
        """The plan of this generation (its coordinator on a port of its own) and a new runner."""
        plan = make_plan(self.jax_overrides, self.rest, life.launcher, generation=life.generation)
        if life.planned is not None:
            life.planned = replace(life.planned, plan=plan)
        self.runner = self.go_word = self.child = None
        command = python_argv.parse(plan.program) if plan.runner else None
        if command is not None:
            self._spawn_runner(life, command)

    def lobby(self, life: lifecycle.Life) -> Place | None:
        """Process 0's, at the coordinator's address, the first port above every generation's
        coordinator (one process a pod: the processes are the pods)."""
        from launcher.core.lobby import Place

        plan = life.plan
        if plan.coordinator is None:
            return None
        host, port = plan.coordinator
        port = lifecycle.lobby_port(port, life.max_restarts, "the coordinator's port")
        return Place(host, port, plan.num_processes, plan.process_id)

    def awaits(self, life: lifecycle.Life) -> lifecycle.Awaited:
        """Process 0: its own name resolves (its client reaches its service through it). The others:
        the coordinator's name resolves and its port accepts. Its port opens a second or two after
        process 0's launcher started (its jax import, its service): a short, capped backoff lets the
        others start within PROBE_CAP of it."""
        return lifecycle.Awaited(resolve=life.plan.resolve, connect=life.plan.connect, cap=PROBE_CAP)

    def wait_failed(self, life: lifecycle.Life, error) -> Outcome:
        from launcher.core.outcome import WaitTimeout

        if isinstance(error, WaitTimeout):
            return _coordinator_never_came(life.plan, life.launcher, error)
        return super().wait_failed(life, error)

    def go(self, life: lifecycle.Life) -> None:
        from launcher.core import settings

        plan, env = life.plan, life.runner_env()
        if self.runner is not None and self.go_word is not None:  # started early: it waits for its word
            self.child = self.runner
            self.go_word.send({"env": {**plan.env_set, **env, REPORT_ENV: life.generation_path("report")}})
            self.go_word.close()
        else:
            self.child = life.supervisor.spawn("jax", list(plan.argv), {**settings.environ(), **plan.env_set, **env})

    def judge(self, life: lifecycle.Life) -> Outcome:
        from launcher.core.outcome import terminated

        supervisor = life.supervisor
        child = self.child or self.runner or supervisor.first_failure
        if child is None:  # nothing started, nothing failed: only a signal stops a pod so early
            if supervisor.received_signal is None:
                raise RuntimeError("the JAX process never started, and no signal stopped it")
            return terminated(supervisor.received_signal).on_node(life.node)
        return jax_outcome(
            life.plan,
            supervisor,
            child,
            records.Report.read(life.generation_path("report")),
            life.launcher.retryable_exit_codes,
            life.memory,
        )


def make_plan(
    jax_overrides: dict[str, Override],
    rest: list[str],
    launcher: LauncherSettings,
    require_program: bool = True,
    generation: int = 0,
) -> JaxPlan:
    """Validate JAX_* and the launcher's knobs, read the host, plan ``generation`` (a restart in place)."""
    from launcher.core.runner_command import plan_inputs
    from launcher.jax.plan import JaxFacts, plan_jax
    from launcher.jax.settings import JaxSettings, load_jax

    given = plan_inputs("jax", JaxSettings, load_jax, jax_overrides, rest, launcher, require_program)
    host = given.host
    facts = JaxFacts(
        hostname=host.hostname, gpu_count=host.gpu_count, runner=RUNNER, rendezvous_timeout=launcher.rendezvous_timeout
    )
    return plan_jax(given.settings, facts, given.program, given.sources, generation)


def _summary(plan: JaxPlan) -> str:
    where = f"process {plan.process_id} of {plan.num_processes}"
    coordinator = f", coordinator {plan.coordinator_address}" if plan.coordinator else ""
    gpus = f", {plan.gpu_count} GPUs in one process" if plan.gpu_count else ""
    how = "initialized by the launcher" if plan.runner else "the program initializes JAX"
    return f"jax: {where}{coordinator}{gpus}; {how}: {' '.join(plan.argv)}"


def _coordinator_never_came(plan: JaxPlan, launcher: LauncherSettings, error: WaitTimeout) -> Outcome:
    """138, naming the coordinator (process 0's pod) this process waited for."""
    from launcher.core.outcome import Outcome, Reasons, RootCause

    host = plan.coordinator[0] if plan.coordinator else None
    pod = host.split(".")[0] if host and not host[:1].isdigit() and not host.startswith("[") else host
    return Outcome.of(
        Reasons.RENDEZVOUS_TIMEOUT,
        f"JAX process {plan.process_id} on {plan.node} waited {launcher.rendezvous_timeout:g}s for the "
        f"coordinator {plan.coordinator_address} (JAX process 0): {error}",
        RootCause(node=pod, rank=0),
    )


def jax_outcome(
    plan: JaxPlan,
    supervisor: Supervisor,
    child: Child,
    report: records.Report | None,
    codes: frozenset[int],
    memory_before: memory.Memory | None = None,
) -> Outcome:
    """How this pod's JAX process ended, as a row of the exit-code table that names the process
    (``memory_before``: the container's memory cgroup when the job started)."""
    from launcher.core.job_outcome import lost, lost_member, stopped_by
    from launcher.core.outcome import (
        Outcome,
        Reasons,
        RootCause,
        classify,
        internal_error,
        last_lines,
        signal_name,
        success,
        terminated,
    )

    node, pid = plan.node, plan.process_id
    returncode = child.returncode if child.returncode is not None else 1
    if returncode == 0:
        return success()
    report = report or records.Report(ending="")  # none written: the exit code and the output alone
    ending, code = report.ending, report.exit_code
    if ending == "failed" and code:
        # The program's own code, reported before the process left: JAX's error polling may end
        # the process first (code 1) once process 0, having read our stop record, has gone.
        returncode = code
    if supervisor.received_signal is not None and supervisor.first_failure is not child:
        return terminated(supervisor.received_signal).on_node(node)
    cause = RootCause(
        node=node,
        rank=pid,
        exit_code=returncode if returncode > 0 else None,
        signal=signal_name(-returncode) if returncode < 0 else None,
    )
    what = f"JAX process {pid} on {node}"
    tail = last_lines(child.tail)
    if ending == "stopped" and report.stopped_by is not None:
        record = report.stopped_by
        root = RootCause(node=record.node, rank=record.rank, exit_code=record.exit_code)
        outcome = classify(
            record.exit_code or 1,
            retryable_codes=codes,
            root_cause=root,
            what=f"JAX process {root.rank} on {root.node}",
        )
        outcome = stopped_by(outcome, what)
        return outcome.with_extra(error=record.error) if record.error else outcome
    if ending == "crashed":  # the runner's own bug, not the program's failure (launcher/core/crash.py)
        return internal_error(str(report.error), report.where, node).with_extra(**tail)
    if ending == "refused" and report.reason == Reasons.RENDEZVOUS_FAILED:
        return Outcome.of(
            Reasons.RENDEZVOUS_FAILED,
            f"{what} could not join the coordinator at {plan.coordinator_address}: {report.error}",
            cause,
            child.evidence,
            tail,
        )
    if ending == "refused" and report.reason == Reasons.UNSUPPORTED_VERSION:
        # The runner refused the interpreter's jax before importing it (core/versions.py).
        return Outcome.of(Reasons.UNSUPPORTED_VERSION, f"{what}: {report.error}", RootCause(node=node, rank=pid))
    if ending == "refused":
        return Outcome.of(
            Reasons.CONFIG_ERROR,
            f"{plan.argv[0]} cannot import jax: {report.error}",
            RootCause(node=node, rank=pid),
        )
    # A peer that vanished without a stop record is named where this process can tell which:
    # the coordinator's (process 0's) pod when its store is gone, else the other of two.
    gone = lost_member(pid, plan.num_processes, report.peer is not None)
    if ending == "peerLost":
        outcome = Outcome.of(
            Reasons.PEER_LOST, f"{what} lost a peer that never said why: {report.error}", cause, report.error, tail
        )
        return outcome if gone is None else lost(outcome, node, pid, [gone])
    text = "\n".join(child.tail)
    if not ending and _DUPLICATE_ID.search(text):
        return Outcome.of(
            Reasons.DUPLICATE_PROCESS_ID,
            f"{what} was aborted by JAX: another process registered as JAX process {pid} too, so two "
            f"pods share JAX_PROCESS_ID={pid}. Trainer sets it to the Job completion index, which "
            "restarts at 0 in every Job of a replicatedJob with replicas > 1 (multi-slice; "
            "kubeflow/trainer#3537)",
            cause,
        )
    if not ending and _SERVICE_FATAL.search(text):
        outcome = Outcome.of(
            Reasons.PEER_LOST,
            f"{what} was aborted by JAX: its coordination service reported another process's failure "
            "or loss (that process's pod names the root cause)",
            cause,
            child.evidence,
            tail,
        )
        return outcome if gone is None else lost(outcome, node, pid, [gone])
    evidence = judge.gather(returncode, child.marks, memory_before=memory_before)
    outcome = judge.verdict(evidence, codes=codes, root_cause=cause, what=what)
    if report.error:
        tail = {**tail, "error": report.error}
    return outcome.with_extra(**tail)
