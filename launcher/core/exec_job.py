"""``trainer-launcher exec -- CMD``: the same supervision and outcome for any command."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from typing import Callable, Protocol

from launcher.core import settings, workspace
from launcher.core.outcome import (
    ConfigError, Outcome, RootCause, classify, code_for, evidence_regex, last_lines, signal_name, success, terminated,
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


class JobWatch(Protocol):
    """What supervision needs of whoever watches the job's progress (the status services, which
    core does not import: the caller hands in how to start one)."""

    hang: Outcome | None  # set when the watch ended the job as hung: that is its outcome

    def rank_env(self) -> dict[str, str]:
        """The variables the command needs to report to the watch."""

    def done(self) -> None:
        """The command is gone: stop watching it."""


# Starts a watch on the supervisor for this node (its name), or says None: nothing to watch.
StartWatch = Callable[[Supervisor, str], JobWatch | None]


def supervise(
    launcher: LauncherSettings,
    command: list[str],
    env: dict[str, str] | None = None,
    find_root_cause: RootCauseFinder | None = None,
    watch: StartWatch | None = None,
) -> Outcome:
    """Run ``command`` under the supervisor and classify how it ended. ``find_root_cause`` may
    refine the root cause from the command's output (mpirun names the rank that failed).
    ``watch``: starts the watch of the job's progress and hangs, whose variables the command
    gets; None: a daemon (sshd), nothing to watch."""
    host = settings.load(HostEnv)
    node = host.hostname or socket.gethostname()
    handoff_dir = tempfile.mkdtemp(prefix="trainer-launcher-exec-")
    handoff = os.path.join(handoff_dir, "outcome.json")
    monitor = None
    try:
        with Supervisor(launcher.grace_period, evidence_regex(launcher.retryable_pattern)) as supervisor:
            env = {**(env or settings.environ()), settings.HANDOFF: handoff}
            if watch is not None:
                monitor = watch(supervisor, node)
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
    return outcome.with_extra(**last_lines(child.tail))
