"""``trainer-launcher exec -- CMD``: the same supervision and outcome for any command."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from typing import Callable

from launcher.core import settings, workspace
from launcher.core.outcome import (
    ConfigError, Outcome, RootCause, classify, code_for, evidence_regex, signal_name, success, terminated,
)
from launcher.core.report import handed_off, run_command
from launcher.core.settings import HostEnv, LauncherSettings, Override
from launcher.core.supervisor import Child, Supervisor


def run_exec(launcher_overrides: dict[str, Override], command: list[str]) -> int:
    def body(launcher: LauncherSettings) -> Outcome:
        if not command:
            raise ConfigError("CMD", None, "a command after the options: trainer-launcher exec [OPTIONS] -- CMD [ARGS...]")
        workspace.warn_if_unwritable()
        return supervise(launcher, command)

    return run_command(launcher_overrides, body)


RootCauseFinder = Callable[[Child, RootCause], RootCause]


def supervise(
    launcher: LauncherSettings,
    command: list[str],
    env: dict[str, str] | None = None,
    find_root_cause: RootCauseFinder | None = None,
    reports_status: bool | None = None,
    board_at: tuple[int, str] | None = None,
) -> Outcome:
    """Run ``command`` under the supervisor and classify how it ended. ``find_root_cause`` may
    refine the root cause from the command's output (mpirun names the rank that failed).
    ``reports_status``: watch the job's progress (launcher.status.monitor), and send the TrainJob's
    status when True; None: a daemon (sshd), nothing to watch. The ranks may run in other pods
    (mpirun's), so their status URL is left alone; ``board_at`` is where those ranks reach this
    pod, to answer a hang with their stacks (launcher.status.board)."""
    host = settings.load(HostEnv)
    node = host.hostname or socket.gethostname()
    handoff_dir = tempfile.mkdtemp(prefix="trainer-launcher-exec-")
    handoff = os.path.join(handoff_dir, "outcome.json")
    monitor = None
    try:
        with Supervisor(launcher.grace_period, evidence_regex(launcher.retryable_pattern)) as supervisor:
            env = {**(env or settings.environ()), settings.HANDOFF: handoff}
            if reports_status is not None:
                from launcher.status.monitor import start as start_monitor

                monitor = start_monitor(launcher, supervisor, node=node, sends=reports_status, relays=False,
                                        board_at=board_at)
                if monitor is not None:
                    # Its variables first in order (MPICH's mpiexec may drop the last one), and
                    # theirs in value.
                    watched = monitor.rank_env()
                    env = {**watched, **env}
                    env.update(watched)
            try:
                child = supervisor.spawn(command[0], command, env)
                supervisor.run()
            finally:
                if monitor is not None:
                    monitor.done()
        inner = handed_off(handoff, code_for(child.returncode))
    finally:
        shutil.rmtree(handoff_dir, ignore_errors=True)
    if monitor is not None and monitor.hang is not None:
        return monitor.hang
    if inner is not None:
        return inner
    if supervisor.received_signal is not None and supervisor.first_failure is None:
        if child.returncode == 0:
            return success()
        return terminated(supervisor.received_signal).on_node(node)
    if child.returncode == 0:
        return success()
    rank = int(host.rank) if host.rank and host.rank.isdigit() else None
    cause = RootCause(node=node, rank=rank, exit_code=child.returncode if child.returncode > 0 else None,
                      signal=None if child.returncode >= 0 else signal_name(-child.returncode))
    what = f"{command[0]} on {node}"
    if find_root_cause is not None:
        cause = find_root_cause(child, cause)
        if cause.rank is not None and cause.rank != rank:
            what = f"rank {cause.rank}" + (f" on {cause.node}" if cause.node else "")
    outcome = classify(child.returncode, retryable_codes=launcher.retryable_exit_codes,
                       evidence=child.evidence, root_cause=cause, what=what)
    return outcome.with_extra(lastLines=list(child.tail)[-5:]) if child.tail else outcome
