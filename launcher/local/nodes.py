"""N pods of a TrainJob on one machine, for every framework's ``trainer-launcher local``.

Each emulated pod is a ``python -m launcher <framework> ...`` process with exactly the environment
the controller would inject (the framework's ``local`` module builds it). As root, each pod also
gets its own UTS and mount namespace: the pod's hostname and a private /etc/hosts in which the
pods' DNS names (``<trainjob>-node-0-<i>.<trainjob>``) resolve to loopback, so the addresses in
that environment are the very names the controller injects. Elsewhere they are 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

from launcher.core import log, settings
from launcher.core.job_outcome import NodeOutcome, root_cause
from launcher.core.outcome import ConfigError, Outcome, Reasons, classify, evidence_regex, success, terminated
from launcher.core.settings import LauncherSettings, Override, parse_host
from launcher.core.supervisor import Child, Supervisor

MAX_PODS = 64
_RANK_LINE = re.compile(r"^\[rank-(\d+)\]:\s?")
# Bind-mount the private hosts file, name the pod, then become the pod's launcher.
_ENTER_NODE = 'mount --bind "$0" /etc/hosts && hostname "$1" && shift && exec "$@"'
# Every emulated pod, whatever its framework, enters its namespaces so; isolation_problem() probes exactly this.
UNSHARE_NODE = ("unshare", "--mount", "--uts", "--propagation", "private", "--")


@dataclass(frozen=True)
class Pods:
    """The ``node`` pods of one emulated TrainJob."""

    nnodes: int
    trainjob: str
    namespaces: bool
    without_namespaces_because: str | None = None  # said once in the start line when auto fell back

    def pod(self, index: int) -> str:
        return f"{self.trainjob}-node-0-{index}"

    def address(self, index: int) -> str:
        """How other pods reach pod ``index``: its DNS name, as the controller injects it."""
        return f"{self.pod(index)}.{self.trainjob}" if self.namespaces else "127.0.0.1"

    def hosts_file(self, current: str) -> str:
        names = " ".join(f"{self.pod(i)} {self.pod(i)}.{self.trainjob}" for i in range(self.nnodes))
        return f"{current.rstrip()}\n127.0.0.1 {names}\n"

    def base_env(self, index: int, base: dict[str, str], drop: tuple[str, ...] = ()) -> dict[str, str]:
        """``base`` without the variables the controller owns (``drop`` prefixes), plus what every pod gets."""
        env = {k: v for k, v in base.items() if not k.startswith(drop)}
        env.update({"JOB_COMPLETION_INDEX": str(index), "HOSTNAME": self.pod(index)})
        return env


def node_prefix(index: int) -> Callable[[str], str]:
    """Prefix each line with its pod (and rank, where the framework tags lines ``[rank-N]:``)."""

    def transform(line: str) -> str:
        match = _RANK_LINE.match(line)
        if match:
            return f"[node-{index} rank-{match[1]}] {line[match.end() :]}"
        return f"[node-{index}] {line}"

    return transform


# Where free_port looks: below the kernel's ephemeral range, which it hands to outgoing connections
# (ours, or any other process's) without asking: a port found free there stays free until the
# master binds it, unless another process binds that very port on purpose.
PORT_FLOOR = 20000
EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"


def free_port(span: int = 1) -> int:
    """A port P such that P .. P+span-1 are all free now (a framework may listen beside its
    master port, as a stop board at the tracker's port + 1: a free P alone leaves P+1 to chance on
    a busy host), below the ephemeral range where the host allows."""
    try:
        with open(EPHEMERAL_RANGE) as handle:
            ceiling = int(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        ceiling = 32768
    pick = random.SystemRandom()
    while True:
        if ceiling - span > PORT_FLOOR:
            first = pick.randrange(PORT_FLOOR, ceiling - span)
        else:  # an ephemeral range that starts low: any port the kernel says is free
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                first = probe.getsockname()[1]
            if first + span - 1 > 65535:
                continue
        try:
            for offset in range(span):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", first + offset))
        except OSError:
            continue
        return first


def isolation_problem(tools: tuple[str, ...] = ()) -> str | None:
    """Why this host cannot give each pod its own mount and UTS namespace, in a few words; None
    when it can. Besides root and the tools, a pod needs an /etc/hosts to bind its private copy
    over, and a root directory whose propagation unshare can make private (a chroot's / is not a
    mount point, so it cannot): the probe runs exactly what a pod would."""
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


def pods(nnodes: str, trainjob: str, isolation: str) -> Pods:
    """Validate ``local``'s --nnodes, --trainjob and --isolation."""
    try:
        count = settings.int_in(1, MAX_PODS)(nnodes)
    except ValueError as error:
        raise ConfigError("--nnodes", nnodes, f"{error} (emulated nodes on this machine)") from None
    try:
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?", trainjob):
            raise ValueError
        parse_host(trainjob)
    except ValueError:
        raise ConfigError(
            "--trainjob", trainjob, "a TrainJob name: lowercase letters, digits and '-', at most 40"
        ) from None
    problem = None if isolation == "none" else isolation_problem()
    if isolation == "namespaces" and problem:
        raise ConfigError(
            "--isolation",
            isolation,
            f"a host that allows per-node namespaces, but {problem} (use --isolation auto or none)",
        )
    return Pods(count, trainjob, isolation != "none" and problem is None, problem)


def port(raw: str | None, flag: str = "--master-port", span: int = 1) -> int:
    """The job's port: ``raw`` validated, or a free one (with the ``span - 1`` after it free too)."""
    try:
        return settings.int_in(1, 65535, "a port")(free_port(span) if raw is None else raw)
    except ValueError as error:
        raise ConfigError(flag, raw, str(error)) from None


def knob_args(overrides: dict[str, Override]) -> list[str]:
    """The launcher options the user gave ``local``, for each pod's launcher (each pod has its own log)."""
    return [arg for name, o in overrides.items() if name != "termination_log" for arg in (o.source, str(o.value))]


# How a framework's pod is set up once the pods are known: its environment for pod i (given the
# caller's), and the job's one-line summary.
# A framework's part of ``local``: from the pods, ``local``'s arguments (its own flags validated
# there) and the launcher's settings (the ports its restarts in place take), each pod's environment
# (what the controller injects) and the job's summary.
PodSetup = Callable[
    [Pods, argparse.Namespace, LauncherSettings], tuple[Callable[[int, dict[str, str]], dict[str, str]], str]
]


def run_framework_pods(
    framework: str,
    launcher_overrides: dict[str, Override],
    framework_overrides: dict[str, Override],
    rest: list[str],
    args: argparse.Namespace,
    setup: PodSetup,
) -> int:
    """``local`` for a framework whose every pod runs ``trainer-launcher FRAMEWORK -- PROGRAM``
    with the options given (``args``: ``local``'s own): ``setup`` validates the framework's own
    flags and says each pod's environment (what the controller injects) and the summary."""
    from launcher.core.report import run_command

    def body(launcher: LauncherSettings) -> Outcome:
        job = pods(args.nnodes, args.trainjob, args.isolation)
        env_of, summary = setup(job, args, launcher)
        if not rest:
            raise ConfigError(
                "PROGRAM",
                None,
                f"a program: trainer-launcher local --framework {framework} --nnodes N -- python SCRIPT [ARGS...]",
            )
        knobs = knob_args(launcher_overrides) + knob_args(framework_overrides)

        def pod_command(index: int) -> tuple[list[str], dict[str, str]]:
            argv = [sys.executable, "-m", "launcher", framework, *knobs, "--", *rest]
            return argv, env_of(index, settings.environ())

        return run_pods(job, launcher, summary, pod_command)

    return run_command(launcher_overrides, body)


def run_pods(
    pods: Pods, launcher: LauncherSettings, summary: str, pod_command: Callable[[int], tuple[list[str], dict[str, str]]]
) -> Outcome:
    """Run every pod's ``(argv, env)`` under one supervisor; the job's outcome names the root cause."""
    workdir = tempfile.mkdtemp(prefix="trainer-launcher-local-")
    try:
        hosts = os.path.join(workdir, "hosts")
        if pods.namespaces:  # isolation_problem() found /etc/hosts there
            with open("/etc/hosts") as current, open(hosts, "w") as private:
                private.write(pods.hosts_file(current.read()))
        isolation = (
            " (per-node namespaces)"
            if pods.namespaces
            else (
                f" (no per-node namespaces: {pods.without_namespaces_because})"
                if pods.without_namespaces_because
                else ""
            )
        )
        log.info(f"local: {summary}{isolation}")
        nodes: list[Child] = []
        with Supervisor(launcher.grace_period, evidence_regex(launcher.retryable_pattern)) as supervisor:
            for index in range(pods.nnodes):
                argv, env = pod_command(index)
                env["LAUNCHER_TERMINATION_LOG"] = os.path.join(workdir, f"node-{index}.json")
                if pods.namespaces:
                    argv = [*UNSHARE_NODE, "sh", "-c", _ENTER_NODE, hosts, pods.pod(index), *argv]
                nodes.append(supervisor.spawn(f"node-{index}", argv, env, transform=node_prefix(index)))
            supervisor.run()
        return local_outcome(supervisor, nodes, workdir, launcher.retryable_exit_codes, pods)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def local_outcome(
    supervisor: Supervisor, nodes: list[Child], workdir: str, codes: frozenset[int], pods: Pods
) -> Outcome:
    """One outcome for the whole job: the pod that failed on its own first is the root cause
    (launcher.core.job_outcome), not a pod that stopped because of it, nor one whose processes only
    saw a peer vanish, even if it exited a moment earlier. All pods share this machine's clock."""
    said = [
        NodeOutcome(index, pods.pod(index), _node_outcome(index, node, workdir, codes, pods), node.exited_at)
        for index, node in enumerate(nodes)
        if node.returncode not in (0, None)
    ]
    root = root_cause(said)
    if root is not None and root.outcome is not None:  # the root is a node that said
        return root.outcome
    if supervisor.received_signal is not None:
        return terminated(supervisor.received_signal)
    # Every failed pod stopped because of another that never said why: the first to go.
    failed = sorted(
        ((n.outcome, n.failed_at) for n in said if n.outcome is not None and n.outcome.reason != Reasons.TERMINATED),
        key=lambda pair: math.inf if pair[1] is None else pair[1],
    )
    return failed[0][0] if failed else success()


def _node_outcome(index: int, node: Child, workdir: str, codes: frozenset[int], pods: Pods) -> Outcome:
    try:
        with open(os.path.join(workdir, f"node-{index}.json")) as handle:
            return Outcome.from_json(json.load(handle))
    except (OSError, ValueError, KeyError):
        return classify(
            node.exit_status, retryable_codes=codes, evidence=node.evidence, what=f"node {pods.pod(index)}"
        ).on_node(pods.pod(index))
