"""``trainer-launcher torch``: torch's part of the pod's life (launcher/core/lifecycle.py): settings -> plan ->
wait -> the agent's torchrun -> outcome.

The torch agent is spawned before anything heavy is imported here (pydantic included), so its
``import torch`` runs while this process validates, plans and waits for the master.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from launcher import k8s, status
from launcher.core import judge, lifecycle, memory
from launcher.core.job_outcome import NodeOutcome, job_outcome, stopped_by
from launcher.core.outcome import (
    PEER_LOSS_PATTERN,
    Outcome,
    Reasons,
    RootCause,
    aborted_on,
    classify,
    internal_error,
    last_lines,
    rank_verdict,
    success,
    terminated,
)
from launcher.core.supervisor import Child, Supervisor
from launcher.export.step import Export
from launcher.runner import report as records
from launcher.torch import rank_end

if TYPE_CHECKING:
    from launcher.core.devices import HostFacts
    from launcher.core.lobby import Place
    from launcher.core.settings import LauncherSettings, Override
    from launcher.torch.plan import TorchPlan

# torchrun exceptions that mean the network or the other nodes, not the program.
# After its own verdict, how much longer than the grace period a node waits for the others':
# they may be stopping ranks that ignore SIGTERM.
PEER_LINGER = 15.0
_RENDEZVOUS_ERRORS = ("Rendezvous", "DistStoreError", "DistNetworkError", "TimeoutError", "ConnectionError", "gaierror")


def make_plan(
    rest: list[str], require_program: bool = True, launcher: LauncherSettings | None = None, generation: int = 0
) -> tuple[TorchPlan, HostFacts]:
    """Read and validate the environment and the torchrun flags after ``--``; plan the run.
    ``launcher``: the loaded knobs, flags included (None: their defaults). What the plan changed
    on its own (fewer accelerators than PET_NPROC_PER_NODE) is logged here, once: not again for a
    later ``generation`` (a restart in place)."""
    from launcher.core import log, settings, versions
    from launcher.core.devices import probe_host
    from launcher.core.settings import HostEnv
    from launcher.torch.plan import plan_torch, split_torchrun_args
    from launcher.torch.settings import TorchSettings

    versions.check("python", "torch", allow=launcher is not None and launcher.allow_untested_versions)
    run = split_torchrun_args(rest)
    torch = settings.load(TorchSettings, run.overrides)
    sources = {
        name: source
        for name in TorchSettings.model_fields
        if (source := settings.source_of(TorchSettings, name, run.overrides))
    }
    host = probe_host(settings.load(HostEnv))
    if not require_program and not run.program:
        run = type(run)(run.given, ("SCRIPT",))
    plan = plan_torch(
        torch,
        host,
        run,
        sources,
        keep_nproc=launcher is not None and launcher.keep_nproc,
        user_env=settings.environ(),
        generation=generation,
    )
    for warning in plan.warnings if not generation else ():
        log.warning(warning)
    return plan, host


def run_torch(launcher_overrides: dict[str, Override], rest: list[str]) -> int:
    return run_pod(launcher_overrides, TorchPod(rest))


def run_pod(launcher_overrides: dict[str, Override], pod: TorchPod) -> int:
    """A torch pod's life (TorchPod, or a subclass for another launch shape)."""
    return lifecycle.live(pod, launcher_overrides, status.start_watch, Export(), k8s.in_place_restart)


class TorchPod(lifecycle.Pod):
    """This node's torchrun, run by the agent (launcher/torch/agent.py), which is started first
    thing: its ``import torch`` overlaps the launcher's validation and wait. Its control pipe takes
    the go word (torchrun's arguments), later this node's verdict; its status pipe says once every
    rank is gone and it waits for that verdict, which it shares with the other nodes."""

    name = "torch"
    # The shapes that come to torchrun by other ways (accelerate_launch.py, legacy_launch.py) are
    # subclasses: they set the words the plan reads (``rest``), variables for every rank on top of
    # the plan's (``extra_env``), and may have the agent run another module's main (``entry``) on
    # other arguments (``agent_args``).
    entry: str | None = None

    def __init__(self, rest: list[str]):
        self.rest = rest
        self.extra_env: dict[str, str] = {}
        self.verdict: Outcome | None = None
        self.standby: _Agent | None = None  # the next generation's agent, torch imported, waiting

    def start_early(self, life: lifecycle.Life) -> None:
        self.life = life
        self._use(self._spawn_agent(life, 0))

    def _spawn_agent(self, life: lifecycle.Life, generation: int, ahead: dict | None = None) -> _Agent:
        """Generation ``generation``'s agent (launcher.torch.agent), with its control and status
        pipes; a later generation's stands by for a restart. ``ahead``: it starts its ranks ahead,
        as this says (launcher.torch.ahead)."""
        options = []
        if ahead is not None:
            options = ["--ranks-ahead", life.path(f"ahead-{generation}.json")]
            with open(options[1], "w") as handle:
                json.dump(ahead, handle)
        control = life.go_pipe()
        agent = _Agent(control)
        agent.status = life.listen(functools.partial(self._on_report, agent), 64)
        agent.child = life.spawn(
            "torchrun",
            [
                sys.executable,
                "-m",
                "launcher.torch.agent",
                "--control-fd",
                str(control.child_fd),
                "--status-fd",
                str(agent.status.child_fd),
                "--report",
                life.generation_path("report", generation),
                "--job",
                life.generation_path("job", generation),
                *options,
            ],
            pipes=(control, agent.status),
            standby=generation > life.generation,  # the next generation's: not this one's child yet
        )
        return agent

    def _use(self, agent: _Agent) -> None:
        self.current, self.verdict = agent, None

    def plan(self, life: lifecycle.Life) -> lifecycle.Planned:
        plan, host = make_plan(self.rest, launcher=life.launcher)
        return lifecycle.Planned(
            plan, host.hostname, _summary(plan), sends=plan.node_rank == 0, max_restarts=plan.max_restarts
        )

    restarts_in_place = True

    def restart(self, life: lifecycle.Life) -> None:
        """The plan of this generation (its store on ports of its own), and its agent: the one that
        stood by since the last generation started, unless it is gone (or this pod replaces a lost
        one and joins the others' generation): then one with its ranks started ahead, which import
        torch while the pods agree."""
        plan, _ = make_plan(self.rest, launcher=life.launcher, generation=life.generation)
        if life.planned is not None:
            life.planned = replace(life.planned, plan=plan)
        standby, self.standby = self.standby, None
        if standby is None or standby.child.returncode is not None:
            if standby is not None:
                standby.close()
            standby = self._spawn_agent(life, life.generation, self._ahead(life, plan, life.generation))
        self._use(standby)

    def _rank_env(self, life: lifecycle.Life, plan: TorchPlan) -> dict[str, str]:
        """What every rank gets beside torchrun's own variables (the restart count aside)."""
        return {**plan.env_set, **self.extra_env, **life.watched, **rank_end.rank_env(life.watched)}

    def _ahead(self, life: lifecycle.Life, plan: TorchPlan, generation: int) -> dict:
        """How generation ``generation``'s ranks start ahead (launcher.torch.ahead)."""
        env = {**self._rank_env(life, plan), **lifecycle.restart_env(generation)}
        return {"nproc": plan.nproc_per_node, "env": env, "unset": list(plan.env_unset)}

    def awaits(self, life: lifecycle.Life) -> lifecycle.Awaited:
        return lifecycle.Awaited(resolve=life.plan.wait.resolve, connect=life.plan.wait.connect)

    def lobby(self, life: lifecycle.Life) -> Place | None:
        """Node rank 0's, at the store's address, the first port above every generation's store;
        for a job whose nodes meet through that store (_peers)."""
        from launcher.core.lobby import Place

        peers = _peers(life.plan, life.node, 0.0, 0)
        if peers is None:
            return None
        port = lifecycle.lobby_port(peers["port"], life.max_restarts, "the job's store port")
        return Place(peers["host"], port, peers["nnodes"], peers["nodeRank"])

    def go(self, life: lifecycle.Life) -> None:
        plan, monitor = life.plan, life.watch
        peers = _peers(plan, life.node, life.launcher.grace_period, life.generation)
        if peers is not None and monitor is not None and monitor.watch is not None:
            # On a hang, every node's stacks, through the agents (launcher.torch.peers).
            peers["dumpRequest"] = life.path(f"dump-stacks-{life.generation}")
            monitor.take_stacks = functools.partial(_stacks_of_every_node, peers["dumpRequest"], life.supervisor)
        entry = {"entry": self.entry} if self.entry else {}
        self.current.control.send(
            {
                "args": self.agent_args(plan),
                **entry,
                "env": {**self._rank_env(life, plan), **lifecycle.restart_env(life.generation)},
                "unset": list(plan.env_unset),
                "grace": life.launcher.grace_period,
                "peers": peers,
            }
        )
        if life.generation < life.max_restarts:
            # The next generation's agent and ranks import torch while this one trains: a restart
            # pays neither the interpreters' start nor the import.
            after = life.generation + 1
            self.standby = self._spawn_agent(life, after, self._ahead(life, plan, after))

    def agent_args(self, plan: TorchPlan) -> list[str]:
        return [*plan.torchrun_args, *plan.program]

    def _on_report(self, agent: _Agent, data: bytes) -> None:
        """The agent has reported and waits for this node's outcome, to share it with the other
        nodes. Every rank is gone: relay what they wrote before judging. (End of file instead:
        the agent died without a report; judged once it is reaped.)"""
        if not data or agent is not self.current:
            return
        agent.status.close()
        self.life.supervisor.drain()
        self.verdict = self._own(self.life)
        agent.control.send(self.verdict.to_json(self.life.launcher.retryable_exit_codes))
        agent.control.close()

    def _own(self, life: lifecycle.Life, peer_vanished: bool | None = None) -> Outcome:
        if life.watch is not None and life.watch.hang is not None:
            return life.watch.hang
        return torch_outcome(
            life.supervisor,
            self.current.child,
            records.Report.read(life.generation_path("report")),
            life.launcher.retryable_exit_codes,
            life.node,
            life.plan.nnodes == "1",
            life.memory,
            peer_vanished,
        )

    def judge(self, life: lifecycle.Life) -> Outcome:
        return self.verdict or self._own(life)

    def conclude(self, life: lifecycle.Life, own: Outcome) -> Outcome:
        nodes = [_node_outcome(summary) for summary in _read_json(life.generation_path("job"), [])]
        nnodes = int(life.plan.nnodes) if life.plan.nnodes.isdigit() else None
        return job_outcome(
            own, life.plan.node_rank, life.node, nodes, nnodes, lambda: self._own(life, peer_vanished=False)
        )


class _Agent:
    """One generation's torch agent, and the pipes to it."""

    child: Child
    status: lifecycle.Listen

    def __init__(self, control: lifecycle.GoPipe):
        self.control = control

    def close(self) -> None:
        self.control.close()
        self.status.close()


def _stacks_of_every_node(request: str, supervisor: Supervisor) -> list:
    """Ask every node's agent for its ranks' stacks and wait for the answer, serving our children's
    output meanwhile (our agent logs our stacks through it). Bounded: the peers' own wait, plus
    room for the agents' watchers to notice."""
    from launcher.status.stacks import RankStacks
    from launcher.torch.peers import DUMP_WAIT, POLL

    with open(request, "w"):
        pass
    done, deadline = request + ".done", time.monotonic() + DUMP_WAIT + 10 * POLL + 5.0
    while not os.path.exists(done) and time.monotonic() < deadline and supervisor.teardown_started is None:
        supervisor.poll(POLL)
    answers = _read_json(done, [])
    return [
        RankStacks(
            pid=r.get("pid") or 0,
            rank=r.get("rank"),
            local_rank=r.get("localRank"),
            text="",
            top=tuple(r.get("top") or ()),
            node=answer.get("node"),
        )
        for answer in answers
        for r in answer.get("ranks", [])
    ]


def _peers(plan: TorchPlan, node: str, grace: float, generation: int) -> dict | None:
    """Where the agents of a fixed-size multi-node job meet (launcher.torch.peers): the store
    torchrun's rendezvous serves. Not for elastic jobs, where a node may leave and the rest go on,
    nor without a node rank per node to tell the nodes apart."""
    if plan.wait.store is None or ":" in plan.nnodes or plan.nnodes == "1":
        return None
    if plan.sources.get("node_rank", "default") == "default":
        return None
    return {
        "host": plan.wait.store[0],
        "port": plan.wait.store[1],
        "nnodes": int(plan.nnodes),
        "nodeRank": plan.node_rank,
        "node": node,
        "linger": grace + PEER_LINGER,
        "generation": generation,
    }


def _summary(plan: TorchPlan) -> str:
    where = f"node {plan.node_rank} of {plan.nnodes}"
    return f"torch: {plan.mode} rendezvous, {where}, {plan.nproc_per_node} processes per node: {' '.join(plan.argv)}"


def _read_json(path: str, default):
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return default


def _node_outcome(summary: dict) -> NodeOutcome:
    outcome = summary.get("outcome")
    return NodeOutcome(
        summary["nodeRank"], summary["node"], Outcome.from_json(outcome) if outcome else None, summary.get("failedAt")
    )


def _own_words(failure: records.Report, one_node: bool):
    """Which of the node's marked lines are this failed rank's own words, for the judge. torch
    prefixes what a rank prints of its exception with "[rankN]: "; a line another rank said is
    never this one's. A fault said by nobody in particular (a C++ log line) counts, since it is this
    node's; a peer's loss only when this rank said it, and never on one node: every peer is local
    there, so a loss is the echo of a local rank's end, which is judged by its own words."""
    rank = failure.rank

    def own(line: str) -> bool:
        speaker = judge.said_by(line)
        if PEER_LOSS_PATTERN.search(line):
            return not one_node and (speaker == rank or (speaker is None and line == failure.error))
        return speaker is None or speaker == rank

    return own


def _failed_first(report: records.Report, marks) -> records.Report:
    """The rank that failed on its own first. The agent's report names the earliest (in whole
    seconds) that torchrun's teardown did not cause; a rank that only echoed another's loss (its
    own words say a peer went away) is passed over for one that failed on its own, on this node."""
    chosen = report.rank_report(report.rank) or report.ranks[0]

    def echoed(failure: records.Report) -> bool:
        if failure.signal in judge.OWN_DEATH_NAMES:
            return False
        said = [line for line in marks if judge.said_by(line) == failure.rank]
        return any(PEER_LOSS_PATTERN.search(line) for line in [*said, failure.error or ""])

    if not echoed(chosen):
        return chosen
    own = [f for f in report.ranks if f.signal != "SIGTERM" and not echoed(f)]
    return min(own, key=lambda f: f.at or 0) if own else chosen


def torch_outcome(
    supervisor: Supervisor,
    agent: Child,
    report: records.Report | None,
    codes: frozenset[int],
    node: str,
    one_node: bool = True,
    memory_before: memory.Memory | None = None,
    peer_vanished: bool | None = None,
) -> Outcome:
    """Turn what the agent reported into a row of the exit-code table (``codes``: the retryable set).
    The agent may still be alive (it waits for this verdict): its report says how it will exit.
    ``one_node``: every rank of the job is on this node; ``memory_before``: the container's memory
    cgroup when the job started (the kernel's OOM count); ``peer_vanished``: False once every other
    node is known to have ended as it chose (launcher.core.job_outcome)."""
    report = report or records.Report(ending="")  # none: the agent died without one
    returncode = agent.returncode if agent.returncode is not None else report.exit_code
    if (report.stopped_by or report.peer) and (not report.ranks or report.ending == "stopped"):
        if report.stopped_by is None and report.ending == "succeeded":
            # Our ranks had all finished (torchrun sat in its exit barrier) when the store's node
            # left: the end of a good run seen a moment early, not a lost peer. Had that node
            # failed, its own pod says so.
            return success()
        return _stopped(report, codes, node)
    failed_first = supervisor.first_failure is agent
    if supervisor.received_signal is not None and not failed_first:
        if returncode == 0:
            return success()
        return terminated(supervisor.received_signal).on_node(node)
    if returncode == 0:
        return success()
    tail = last_lines(agent.tail)
    if report.ranks:
        root = _failed_first(report, agent.marks)
        cause = RootCause(
            node=node,
            rank=root.rank,
            local_rank=root.local_rank,
            exit_code=root.exit_code,
            signal=root.signal,
        )
        said: str | None = root.error
        marked = [said] if said and supervisor.evidence is not None and supervisor.evidence.search(said) else []
        evidence = judge.gather(
            root.returncode or 1,
            [*agent.marks, *marked],
            own=_own_words(root, one_node),
            memory_before=memory_before,
        )
        if peer_vanished is not None:
            evidence = replace(evidence, peer_vanished=peer_vanished)
        outcome = judge.verdict(
            evidence,
            codes=codes,
            root_cause=cause,
            what=f"rank {root.rank} (local rank {root.local_rank}) on {node}",
        )
        if said := root.error or (aborted_on(agent.tail) if root.signal == "SIGABRT" else None):
            # A rank the C++ runtime aborted (torch's NCCL watchdog on a CUDA error) wrote no
            # error file: its "what():" line is its error.
            tail = {**tail, "error": said}
        failed = [f.rank for f in report.ranks]
        return outcome.with_extra(failedRanks=failed, **tail)
    if report.ending == "crashed":
        return internal_error(str(report.error), report.where, node).with_extra(**tail)
    if report.ending == "refused" and report.reason == Reasons.CONFIG_ERROR:
        return Outcome.of(Reasons.CONFIG_ERROR, str(report.error), RootCause(node=node))
    if report.ending == "refused":  # torchrun rejected its arguments, or its rendezvous failed
        message = f"torchrun on {node} failed: {report.error}"
        if any(marker in str(report.error) for marker in _RENDEZVOUS_ERRORS):
            return Outcome.of(Reasons.RENDEZVOUS_FAILED, message, RootCause(node=node), agent.evidence, tail)
        return Outcome.of(Reasons.CONFIG_ERROR, message, RootCause(node=node))
    if not report.ending and returncode is not None and returncode > 0:
        # The agent reports every way torchrun ends; exiting on its own without a report, it
        # crashed (an uncaught exception: its traceback's last line is in its output).
        last = next(
            (line for line in reversed(agent.tail) if line.strip()),
            f"the torch agent exited with code {returncode} without a report",
        )
        return internal_error(last.strip(), None, node).with_extra(**tail)
    return classify(
        returncode if returncode is not None else 1,
        retryable_codes=codes,
        evidence=agent.evidence,
        root_cause=RootCause(node=node),
        what=f"torchrun on {node}",
    ).with_extra(**tail)


def _stopped(report: records.Report, codes: frozenset[int], node: str) -> Outcome:
    """This node stopped its ranks because another node's failed (its stop record), or because
    the node serving the job's store vanished without a word."""
    record = report.stopped_by
    if record is None:
        lost = str(report.peer)
        return Outcome.of(
            Reasons.PEER_LOST,
            f"the node serving the job's store at {lost} is gone; {node} stopped its ranks",
            RootCause(node=lost.rsplit(":", 1)[0]),
        )
    return stopped_by(rank_verdict(record, codes), node)
