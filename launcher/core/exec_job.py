"""``trainer-launcher exec -- CMD``: the pod's life (launcher/core/lifecycle.py) for one command, with
the same supervision and outcome as every framework's. Also the part of each framework whose pod runs
one command: mpirun, a worker's sshd, a plug-in's program."""

from __future__ import annotations

import signal
import socket
from typing import TYPE_CHECKING

from launcher.core import judge, lifecycle
from launcher.core.outcome import (
    ConfigError,
    Outcome,
    RootCause,
    code_for,
    last_lines,
    signal_name,
    success,
    terminated,
)
from launcher.core.supervisor import Child

if TYPE_CHECKING:  # pydantic: loaded while what start_early started imports (launcher.initializers.job)
    from launcher.core.settings import Override


def run_exec(
    launcher_overrides: dict[str, Override], command: list[str], export: lifecycle.Export | None = None
) -> int:
    return lifecycle.live(CommandPod(command), launcher_overrides, export=export)


class CommandPod(lifecycle.Pod):
    """One command, supervised: started at ``go``, judged by its exit (or by the outcome a launcher
    nested in it handed over). A framework that runs one command plans it and sets ``command`` and
    ``env``; it may name the root cause from the command's output (:meth:`root_cause`)."""

    name = "exec"

    def __init__(self, command: list[str], env: dict[str, str] | None = None):
        self.command, self.env = command, env
        self.child: Child | None = None

    def plan(self, life: lifecycle.Life) -> lifecycle.Planned:
        if not self.command:
            raise ConfigError(
                "CMD", None, "a command after the options: trainer-launcher exec [OPTIONS] -- CMD [ARGS...]"
            )
        return lifecycle.Planned(None, node_name(), "")

    def go(self, life: lifecycle.Life) -> None:
        from launcher.core import settings

        env = {
            **(self.env if self.env is not None else settings.environ()),
            settings.HANDOFF: handoff(life),
        }
        if life.watched:
            # Its variables first in order (MPICH's mpiexec may drop the last one), and theirs in value.
            env = {**life.watched, **env}
            env.update(life.watched)
        self.child = life.supervisor.spawn(self.command[0], self.command, env)

    def root_cause(self, child: Child, cause: RootCause) -> RootCause:
        """The root cause, refined from the command's output (mpirun names the rank that failed)."""
        return cause

    def own_words(self, line: str) -> bool:
        """Whether a marked line of the command's output is the failing process's own words (the
        judge's evidence). One command: every line it printed is."""
        return True

    def judge(self, life: lifecycle.Life) -> Outcome:
        from launcher.core.report import handed_off

        supervisor, child, node = life.supervisor, self.child, life.node
        signum = supervisor.received_signal
        if child is None:  # stopped before it started: only a signal does that (it starts at go)
            if signum is None:
                raise RuntimeError(f"{self.name}: the command never started, and no signal stopped it")
            return terminated(signum).on_node(node)
        returncode = child.exit_status
        inner = handed_off(handoff(life), code_for(returncode))
        if inner is not None:
            return inner
        if signum is not None and supervisor.first_failure is None:
            if returncode == 0:
                return success()
            return terminated(signum).on_node(node)
        if returncode == 0:
            return success()
        from launcher.core import settings

        host = settings.load(settings.HostEnv)
        rank = int(host.rank) if host.rank and host.rank.isdigit() else None
        cause = RootCause(
            node=node,
            rank=rank,
            exit_code=returncode if returncode > 0 else None,
            signal=None if returncode >= 0 else signal_name(-returncode),
        )
        what = f"{self.command[0]} on {node}"
        cause = self.root_cause(child, cause)
        if cause.rank is not None and cause.rank != rank:
            what = f"rank {cause.rank}" + (f" on {cause.node}" if cause.node else "")
        elif cause.signal and returncode >= 0:  # the command names a signal that ended one of its ranks
            what = "a rank" + (f" on {cause.node}" if cause.node else f" of {self.command[0]}")
        # The process that failed first: a rank a signal ended, where the command names it (mpirun
        # exits with a code of its own for it), else the command itself.
        named = cause.signal if cause.signal in signal.Signals.__members__ else None
        failed = -int(signal.Signals[named]) if named is not None else returncode
        evidence = judge.gather(failed, child.marks, own=self.own_words, memory_before=life.memory)
        outcome = judge.verdict(evidence, codes=life.launcher.retryable_exit_codes, root_cause=cause, what=what)
        return outcome.with_extra(**last_lines(child.tail))


def handoff(life: lifecycle.Life) -> str:
    """Where a launcher nested in the command hands its outcome over: a file per start in place,
    so an earlier start's is never read as this one's."""
    return life.path(f"outcome-{life.generation}.json" if life.generation else "outcome.json")


def node_name() -> str:
    """This pod's name: HOSTNAME, else the kernel's."""
    from launcher.core import settings

    return settings.load(settings.HostEnv).hostname or socket.gethostname()
