"""``trainer-launcher torch``: settings -> plan -> wait -> supervised torchrun -> outcome.

The torch agent is spawned before anything heavy is imported here (pydantic included), so its
``import torch`` runs while this process validates, plans and waits for the master.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from typing import TYPE_CHECKING

from launcher.outcome import (
    CONFIG_ERROR, TRANSIENT, LauncherError, Outcome, RootCause, classify, evidence_regex, success, terminated,
)
from launcher.supervisor import Child, Interrupted, Supervisor

if TYPE_CHECKING:
    from launcher.devices import HostFacts
    from launcher.settings import LauncherSettings, Override
    from launcher.torch_plan import TorchPlan

# torchrun exceptions that mean the network or the other nodes, not the program.
_RENDEZVOUS_ERRORS = ("Rendezvous", "DistStoreError", "DistNetworkError", "TimeoutError", "ConnectionError", "gaierror")


def make_plan(rest: list[str], require_program: bool = True) -> tuple[TorchPlan, HostFacts]:
    """Read and validate the environment and the torchrun flags after ``--``; plan the run."""
    from launcher import settings
    from launcher.devices import probe_host
    from launcher.settings import HostEnv, TorchSettings
    from launcher.torch_plan import plan_torch, split_torchrun_args

    run = split_torchrun_args(rest)
    torch = settings.load(TorchSettings, run.overrides)
    sources = {
        name: source
        for name in TorchSettings.model_fields
        if (source := settings.source_of(TorchSettings, name, run.overrides))
    }
    host = probe_host(settings.load(HostEnv))
    if not require_program and not run.program:
        run = type(run)(run.overrides, run.passthrough, ("SCRIPT",))
    return plan_torch(torch, host, run, sources), host


def run_torch(launcher_overrides: dict[str, Override], rest: list[str]) -> int:
    termination_log = None
    with Supervisor() as supervisor:
        report_dir = tempfile.mkdtemp(prefix="trainer-launcher-")
        control_r, control_w = os.pipe()
        try:
            # Start importing torch now, while we validate and wait.
            agent = supervisor.spawn(
                "torchrun",
                [sys.executable, "-m", "launcher.torch_agent", "--control-fd", str(control_r),
                 "--report", os.path.join(report_dir, "report.json")],
                pass_fds=(control_r,),
            )
            os.close(control_r)
            from launcher import log, settings
            from launcher.report import deliver
            from launcher.settings import LauncherSettings

            try:
                launcher = settings.load(LauncherSettings, launcher_overrides)
                termination_log = launcher.termination_log
                log.configure(launcher.log_format)
                plan, host = make_plan(rest)
            except LauncherError:
                supervisor.kill_all()
                raise
            supervisor.grace_period = launcher.grace_period
            supervisor.evidence = evidence_regex(launcher.retryable_pattern)
            log.info(_summary(plan), plan=plan.to_json())
            try:
                _wait(plan, launcher, supervisor)
                os.write(control_w, json.dumps(
                    {"args": [*plan.torchrun_args, *plan.program], "env": plan.env_set, "unset": list(plan.env_unset)}
                ).encode())
            except (Interrupted, BrokenPipeError):
                pass  # a signal, or the agent exited early: the supervisor already knows
            except LauncherError as error:
                supervisor.kill_all()
                supervisor.run()
                return deliver(error.outcome().on_node(host.hostname), termination_log)
            finally:
                os.close(control_w)
                control_w = -1
            supervisor.run()
            report = _read_report(os.path.join(report_dir, "report.json"))
            outcome = torch_outcome(supervisor, agent, report, launcher.retryable_exit_codes, host.hostname)
            return deliver(outcome, termination_log)
        except LauncherError as error:
            from launcher.report import deliver

            return deliver(error.outcome(), termination_log)
        finally:
            if control_w != -1:
                os.close(control_w)
            shutil.rmtree(report_dir, ignore_errors=True)


def _summary(plan: TorchPlan) -> str:
    where = f"node {plan.node_rank} of {plan.nnodes}"
    return f"torch: {plan.mode} rendezvous, {where}, {plan.nproc_per_node} processes per node: {' '.join(plan.argv)}"


def _wait(plan: TorchPlan, launcher: LauncherSettings, supervisor: Supervisor) -> None:
    from launcher import log, netwait

    deadline = time.monotonic() + launcher.rendezvous_timeout
    if plan.wait.resolve:
        netwait.wait_until_resolves(plan.wait.resolve, deadline, supervisor.sleep, log.info)
    if plan.wait.connect:
        netwait.wait_until_accepts(*plan.wait.connect, deadline, supervisor.sleep, log.info)


def _read_report(path: str) -> dict:
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return {}


def torch_outcome(supervisor: Supervisor, agent: Child, report: dict, codes: frozenset[int], node: str) -> Outcome:
    """Turn what the agent reported into a row of the exit-code table (``codes``: the retryable set)."""
    failed_first = supervisor.first_failure is agent
    if supervisor.received_signal is not None and not failed_first:
        if agent.returncode == 0:
            return success()
        return terminated(supervisor.received_signal, codes).on_node(node)
    if agent.returncode == 0:
        return success()
    tail = {"lastLines": list(agent.tail)[-5:]} if agent.tail else {}
    if "failures" in report:
        root = next(f for f in report["failures"] if f["rank"] == report["rootRank"])
        returncode = root["exitCode"] if root["exitCode"] is not None else -_signum(root["signal"])
        cause = RootCause(node=node, rank=root["rank"], local_rank=root["localRank"],
                          exit_code=root["exitCode"], signal=root["signal"])
        outcome = classify(returncode, retryable_codes=codes, evidence=agent.evidence, root_cause=cause,
                           what=f"rank {root['rank']} (local rank {root['localRank']}) on {node}")
        if root.get("message"):
            tail = {**tail, "error": root["message"]}
        failed = [f["rank"] for f in report["failures"]]
        return outcome.with_extra(failedRanks=failed, **tail)
    if "error" in report:
        return Outcome(CONFIG_ERROR, False, "ConfigError", report["error"], RootCause(node=node))
    if "agentError" in report:
        message = f"torchrun on {node} failed: {report['agentError']}"
        if any(marker in report.get("type", "") or marker in report["agentError"] for marker in _RENDEZVOUS_ERRORS):
            return Outcome(TRANSIENT, True, "RendezvousFailed", message, RootCause(node=node), agent.evidence, tail)
        if report.get("exitCode"):
            return Outcome(CONFIG_ERROR, False, "ConfigError", message, RootCause(node=node))
    return classify(agent.returncode, retryable_codes=codes, evidence=agent.evidence,
                    root_cause=RootCause(node=node), what=f"torchrun on {node}").with_extra(**tail)


def _signum(name: str | None) -> int:
    import signal

    try:
        return int(signal.Signals[name]) if name else 1
    except KeyError:
        return 1
