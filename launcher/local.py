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
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from launcher import log, settings
from launcher.job_outcome import NodeOutcome, root_cause
from launcher.outcome import ConfigError, Outcome, classify, evidence_regex, success, terminated
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
    without_namespaces_because: str | None = None  # said once in the start line when auto fell back

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


# Every emulated node (torch and MPI) enters its namespaces so; isolation_problem() probes exactly this.
UNSHARE_NODE = ("unshare", "--mount", "--uts", "--propagation", "private", "--")


def isolation_problem(tools: tuple[str, ...] = ()) -> str | None:
    """Why this host cannot give each node its own mount and UTS namespace, in a few words; None
    when it can. Besides root and the tools, a node needs an /etc/hosts to bind its private copy
    over, and a root directory whose propagation unshare can make private (a chroot's / is not a
    mount point, so it cannot): the probe runs exactly what a node would."""
    if os.geteuid() != 0:
        return "they need root"
    missing = [tool for tool in ("unshare", "mount", "hostname", *tools) if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not found on PATH"
    if not os.path.isfile("/etc/hosts"):
        return "there is no /etc/hosts to bind each node's private one over"
    probe = subprocess.run([*UNSHARE_NODE, "true"], stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if probe.returncode != 0:
        said = (probe.stderr.strip().splitlines() or [f"unshare exited {probe.returncode}"])[-1]
        hint = " (/ is not a mount point, as in a chroot)" if "propagation" in said else ""
        return f"{said}{hint}"
    return None


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
    problem = None if isolation == "none" else isolation_problem()
    if isolation == "namespaces" and problem:
        raise ConfigError("--isolation", isolation, f"a host that allows per-node namespaces, but {problem} "
                                                    "(use --isolation auto or none)")
    return LocalJob(count, nproc_value, trainjob, port, isolation != "none" and problem is None, problem)


def _run(job: LocalJob, launcher: LauncherSettings, overrides: dict[str, Override], rest: list[str]) -> Outcome:
    workdir = tempfile.mkdtemp(prefix="trainer-launcher-local-")
    try:
        hosts = os.path.join(workdir, "hosts")
        if job.namespaces:  # isolation_problem() found /etc/hosts there
            with open("/etc/hosts") as current, open(hosts, "w") as private:
                private.write(job.hosts_file(current.read()))
        knobs = [arg for name, o in overrides.items() if name != "termination_log" for arg in (o.source, str(o.value))]
        isolation = " (per-node namespaces)" if job.namespaces else (
            f" (no per-node namespaces: {job.without_namespaces_because})" if job.without_namespaces_because else "")
        log.info(f"local: {job.nnodes} nodes x {job.nproc_per_node} processes, master {job.master_addr}:{job.master_port}"
                 f"{isolation}")
        nodes: list[Child] = []
        with Supervisor(launcher.grace_period, evidence_regex(launcher.retryable_pattern)) as supervisor:
            for index in range(job.nnodes):
                env = job.node_env(index, settings.environ())
                env["LAUNCHER_TERMINATION_LOG"] = os.path.join(workdir, f"node-{index}.json")
                argv = [sys.executable, "-m", "launcher", "torch", *knobs, "--", "--tee", "3", *rest]
                if job.namespaces:
                    argv = [*UNSHARE_NODE, "sh", "-c", _ENTER_NODE, hosts, job.pod(index), *argv]
                nodes.append(supervisor.spawn(f"node-{index}", argv, env, transform=node_prefix(index)))
            supervisor.run()
        return local_outcome(supervisor, nodes, workdir, launcher.retryable_exit_codes, job)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def local_outcome(supervisor: Supervisor, nodes: list[Child], workdir: str, codes: frozenset[int], job: LocalJob) -> Outcome:
    """One outcome for the whole job: the node that failed on its own first is the root cause
    (launcher.job_outcome), not a node that stopped because of it, nor one whose ranks only saw
    a peer vanish, even if it exited a moment earlier. All nodes share this machine's clock."""
    said = [NodeOutcome(index, job.pod(index), _node_outcome(index, node, workdir, codes, job), node.exited_at)
            for index, node in enumerate(nodes) if node.returncode not in (0, None)]
    root = root_cause(said)
    if root is not None:
        return root.outcome
    if supervisor.received_signal is not None:
        return terminated(supervisor.received_signal)
    # Every failed node stopped because of another that never said why: the first to go.
    failed = sorted((n for n in said if n.outcome.reason != "Terminated"), key=lambda n: n.failed_at)
    return failed[0].outcome if failed else success()


def _node_outcome(index: int, node: Child, workdir: str, codes: frozenset[int], job: LocalJob) -> Outcome:
    try:
        with open(os.path.join(workdir, f"node-{index}.json")) as handle:
            return Outcome.from_json(json.load(handle))
    except (OSError, ValueError, KeyError):
        return classify(node.returncode, retryable_codes=codes, evidence=node.evidence,
                        what=f"node {job.pod(index)}").on_node(job.pod(index))
