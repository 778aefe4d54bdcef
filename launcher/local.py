"""``trainer-launcher local``: an N-node TrainJob on one machine, through the same code paths.

Each emulated node is a ``trainer-launcher torch`` process with exactly the environment Trainer's
torch policy injects (PET_*, JOB_COMPLETION_INDEX, HOSTNAME). As root, each node also gets its
own UTS and mount namespace: the pod's hostname and a private /etc/hosts in which the pods' DNS
names (``<trainjob>-node-0-<i>.<trainjob>``) resolve to loopback, so the master address is the
very name the controller would inject. Elsewhere the master is 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import sys
import tempfile
from dataclasses import dataclass

from launcher import log, settings
from launcher.outcome import PEER_LOSS_PATTERN, ConfigError, Outcome, classify, evidence_regex, success, terminated
from launcher.report import run_command
from launcher.settings import LauncherSettings, Override, parse_host
from launcher.supervisor import Child, Supervisor

_RANK_LINE = re.compile(r"^\[rank-(\d+)\]:\s?")
# Bind-mount the private hosts file, name the node, then become the node's launcher.
_ENTER_NODE = 'mount --bind "$0" /etc/hosts && hostname "$1" && shift && exec "$@"'


@dataclass(frozen=True)
class LocalJob:
    nnodes: int
    nproc_per_node: str
    trainjob: str
    master_port: int
    namespaces: bool

    def pod(self, index: int) -> str:
        return f"{self.trainjob}-node-0-{index}"

    @property
    def master_addr(self) -> str:
        return f"{self.pod(0)}.{self.trainjob}" if self.namespaces else "127.0.0.1"

    def node_env(self, index: int, base: dict[str, str]) -> dict[str, str]:
        """What the controller injects into the ``node`` container of pod ``index``."""
        env = {k: v for k, v in base.items() if not k.startswith("PET_")}
        env.update({
            "PET_NNODES": str(self.nnodes),
            "PET_NPROC_PER_NODE": self.nproc_per_node,
            "PET_NODE_RANK": str(index),
            "PET_MASTER_ADDR": self.master_addr,
            "PET_MASTER_PORT": str(self.master_port),
            "JOB_COMPLETION_INDEX": str(index),
            "HOSTNAME": self.pod(index),
            # torchrun prefixes each rank's lines with this when it tees them (--tee 3).
            "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[rank-${rank}]:",
        })
        return env

    def hosts_file(self, current: str) -> str:
        names = " ".join(f"{self.pod(i)} {self.pod(i)}.{self.trainjob}" for i in range(self.nnodes))
        return f"{current.rstrip()}\n127.0.0.1 {names}\n"


def node_prefix(index: int):
    def transform(line: str) -> str:
        match = _RANK_LINE.match(line)
        if match:
            return f"[node-{index} rank-{match[1]}] {line[match.end():]}"
        return f"[node-{index}] {line}"

    return transform


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _can_isolate() -> bool:
    return os.geteuid() == 0 and shutil.which("unshare") is not None and shutil.which("mount") is not None


def run_local(
    launcher_overrides: dict[str, Override],
    rest: list[str],
    nnodes: str,
    nproc_per_node: str,
    trainjob: str,
    master_port: str | None,
    isolation: str,
) -> int:
    def body(launcher: LauncherSettings) -> Outcome:
        job = _job(nnodes, nproc_per_node, trainjob, master_port, isolation)
        if not rest:
            raise ConfigError("SCRIPT", None, "a training script: trainer-launcher local --nnodes N --nproc-per-node P -- SCRIPT [ARGS...]")
        return _run(job, launcher, launcher_overrides, rest)

    return run_command(launcher_overrides, body)


def _job(nnodes: str, nproc: str, trainjob: str, master_port: str | None, isolation: str) -> LocalJob:
    try:
        count = settings.int_in(1, 64)(nnodes)
    except ValueError as error:
        raise ConfigError("--nnodes", nnodes, f"{error} (emulated nodes on this machine)") from None
    try:
        nproc_value = str(settings.parse_nproc(nproc))
    except ValueError as error:
        raise ConfigError("--nproc-per-node", nproc, str(error)) from None
    try:
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?", trainjob):
            raise ValueError
        parse_host(trainjob)
    except ValueError:
        raise ConfigError("--trainjob", trainjob, "a TrainJob name: lowercase letters, digits and '-', at most 40") from None
    port = _free_port() if master_port is None else master_port
    try:
        port = settings.int_in(1, 65535, "a port")(port)
    except ValueError as error:
        raise ConfigError("--master-port", master_port, str(error)) from None
    if isolation == "namespaces" and not _can_isolate():
        raise ConfigError("--isolation", isolation, "root and unshare(1) for per-node namespaces (or --isolation none)")
    return LocalJob(count, nproc_value, trainjob, port, isolation == "namespaces" or (isolation == "auto" and _can_isolate()))


def _run(job: LocalJob, launcher: LauncherSettings, overrides: dict[str, Override], rest: list[str]) -> Outcome:
    workdir = tempfile.mkdtemp(prefix="trainer-launcher-local-")
    try:
        hosts = os.path.join(workdir, "hosts")
        with open("/etc/hosts") as current, open(hosts, "w") as private:
            private.write(job.hosts_file(current.read()))
        knobs = [arg for name, o in overrides.items() if name != "termination_log" for arg in (o.source, str(o.value))]
        log.info(f"local: {job.nnodes} nodes x {job.nproc_per_node} processes, master {job.master_addr}:{job.master_port}"
                 f"{' (per-node namespaces)' if job.namespaces else ''}")
        nodes: list[Child] = []
        with Supervisor(launcher.grace_period, evidence_regex(launcher.retryable_pattern)) as supervisor:
            for index in range(job.nnodes):
                env = job.node_env(index, settings.environ())
                env["LAUNCHER_TERMINATION_LOG"] = os.path.join(workdir, f"node-{index}.json")
                argv = [sys.executable, "-m", "launcher", "torch", *knobs, "--", "--tee", "3", *rest]
                if job.namespaces:
                    argv = ["unshare", "--mount", "--uts", "--propagation", "private", "--",
                            "sh", "-c", _ENTER_NODE, hosts, job.pod(index), *argv]
                nodes.append(supervisor.spawn(f"node-{index}", argv, env, transform=node_prefix(index)))
            supervisor.run()
        return local_outcome(supervisor, nodes, workdir, launcher.retryable_exit_codes, job)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def local_outcome(supervisor: Supervisor, nodes: list[Child], workdir: str, codes: frozenset[int], job: LocalJob) -> Outcome:
    """One outcome for the whole job: the node that failed on its own first is the root cause.

    A node whose ranks only saw a peer vanish (connection reset/closed by peer) is a victim: it
    ranks after a node that failed for a reason of its own, even if it exited a moment earlier.
    """
    candidates = []
    for index, node in enumerate(nodes):
        if node.returncode in (0, None):
            continue
        outcome = _node_outcome(index, node, workdir, codes, job)
        if outcome.reason == "Terminated":
            continue  # it stopped because we (or the signal we forwarded) told it to
        victim = bool(PEER_LOSS_PATTERN.search(outcome.evidence or ""))
        candidates.append((victim, node.exited_at, outcome))
    if candidates:
        return min(candidates, key=lambda c: (c[0], c[1]))[2]
    if supervisor.received_signal is not None:
        return terminated(supervisor.received_signal, codes)
    return success()


def _node_outcome(index: int, node: Child, workdir: str, codes: frozenset[int], job: LocalJob) -> Outcome:
    try:
        with open(os.path.join(workdir, f"node-{index}.json")) as handle:
            return Outcome.from_json(json.load(handle))
    except (OSError, ValueError, KeyError):
        return classify(node.returncode, retryable_codes=codes, evidence=node.evidence,
                        what=f"node {job.pod(index)}").on_node(job.pod(index))
