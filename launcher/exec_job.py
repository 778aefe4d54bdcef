"""``trainer-launcher exec -- CMD``: the same supervision and outcome for any command."""

from __future__ import annotations

import socket

from launcher import log, settings
from launcher.outcome import (
    ConfigError, LauncherError, RootCause, classify, evidence_regex, signal_name, success, terminated,
)
from launcher.report import deliver
from launcher.settings import HostEnv, LauncherSettings, Override
from launcher.supervisor import Supervisor


def run_exec(launcher_overrides: dict[str, Override], command: list[str]) -> int:
    termination_log = None
    try:
        launcher = settings.load(LauncherSettings, launcher_overrides)
        termination_log = launcher.termination_log
        log.configure(launcher.log_format)
        if not command:
            raise ConfigError("CMD", None, "a command after the options: trainer-launcher exec [OPTIONS] -- CMD [ARGS...]")
        host = settings.load(HostEnv)
        with Supervisor(launcher.grace_period, evidence_regex(launcher.retryable_pattern)) as supervisor:
            child = supervisor.spawn(command[0], command)
            supervisor.run()
        node = host.hostname or socket.gethostname()
        rank = int(host.rank) if host.rank and host.rank.isdigit() else None
        if supervisor.received_signal is not None and supervisor.first_failure is None:
            outcome = success() if child.returncode == 0 else terminated(supervisor.received_signal, launcher.retryable_exit_codes)
        elif child.returncode == 0:
            outcome = success()
        else:
            cause = RootCause(node=node, rank=rank, exit_code=child.returncode if child.returncode > 0 else None,
                              signal=None if child.returncode >= 0 else signal_name(-child.returncode))
            outcome = classify(child.returncode, retryable_codes=launcher.retryable_exit_codes,
                               evidence=child.evidence, root_cause=cause, what=f"{command[0]} on {node}")
            if child.tail:
                outcome = outcome.with_extra(lastLines=list(child.tail)[-5:])
        return deliver(outcome, termination_log)
    except LauncherError as error:
        return deliver(error.outcome(), termination_log)
