"""``trainer-launcher local --mpi IMPL``: an N-node MPI TrainJob on one machine, as root.

Everything runs in one private network namespace (the job's "cluster network"): a veth there
carries one 127.0.0.x address per pod, because Open MPI 5 will not use a loopback-only interface.
Each pod gets its own UTS and mount namespace (hostname, private /etc/hosts in which the pods'
DNS names resolve, the ssh Secret bind-mounted read-only with the Trainer's modes) and drops to
the unprivileged user: the workers run ``trainer-launcher mpi --worker`` (a real sshd on port
2222) and the launcher pod runs ``trainer-launcher mpi -- PROGRAM`` against the Trainer-format
hostfile, through exactly the code a cluster runs.
"""

from __future__ import annotations

import ctypes
import os
import pwd
import shutil
import subprocess
import sys
import tempfile

from launcher.core import log, settings
from launcher.core.outcome import ConfigError, Outcome, classify, success, terminated
from launcher.core.report import run_command
from launcher.core.settings import LauncherSettings, Override
from launcher.core.supervisor import Supervisor
from launcher.local.nodes import UNSHARE_NODE, isolation_problem

CLONE_NEWNET = 0x40000000
INTERFACE = "tl0"
LAUNCHER_IP = "127.0.0.9"
_ENTER_POD = (
    'mount --bind "$0" /etc/hosts && mount --bind -o ro "$1" "$1" && mount -o remount,bind,ro "$1" '
    '&& hostname "$2" && shift 2 && exec "$@"'
)


def worker_ip(index: int) -> str:
    return f"127.0.0.{10 + index}"


def run_local_mpi(
    launcher_overrides: dict[str, Override],
    mpi_overrides: dict[str, Override],
    rest: list[str],
    implementation: str,
    nnodes: str,
    nproc: str,
    trainjob: str,
    user: str,
) -> int:
    def body(launcher: LauncherSettings) -> Outcome:
        count = _count("--nnodes", nnodes, 1, 32)
        slots = _count("--nproc-per-node", nproc, 1, 256)
        if problem := isolation_problem(tools=("ip", "setpriv")):
            raise ConfigError(
                "--mpi",
                implementation,
                f"a host that allows per-node namespaces (each MPI node needs its own), but {problem}",
            )
        if not rest:
            raise ConfigError(
                "PROGRAM", None, "a program: trainer-launcher local --mpi IMPL --nnodes N --nproc-per-node P -- PROGRAM"
            )
        try:
            account = pwd.getpwnam(user)
        except KeyError:
            raise ConfigError(
                "--user", user, "an existing unprivileged user to run sshd and mpirun as (e.g. mpiuser)"
            ) from None
        return _run(launcher, launcher_overrides, mpi_overrides, rest, implementation, count, slots, trainjob, account)

    return run_command(launcher_overrides, body)


def _count(flag: str, raw: str, low: int, high: int) -> int:
    try:
        return settings.int_in(low, high)(raw)
    except ValueError as error:
        raise ConfigError(flag, raw, str(error)) from None


def _private_network(nnodes: int, on_interface: bool) -> None:
    """Move this process (and so every pod it starts) into a new network namespace. Open MPI
    wants the pods' addresses on a non-loopback interface; hydra (MPICH, Intel) must NOT see
    them on an interface of its own, or it starts every rank locally."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) != 0:
        raise ConfigError("--mpi", "local", f"a new network namespace (unshare: {os.strerror(ctypes.get_errno())})")
    commands = [
        ["ip", "link", "set", "lo", "up"],
        ["ip", "link", "add", INTERFACE, "type", "veth", "peer", "name", "tl1"],
        ["ip", "link", "set", INTERFACE, "up"],
        ["ip", "link", "set", "tl1", "up"],
        ["ip", "addr", "add", f"{LAUNCHER_IP}/8", "dev", INTERFACE],
    ]
    if on_interface:
        commands += [["ip", "addr", "add", f"{worker_ip(i)}/8", "dev", INTERFACE] for i in range(nnodes)]
    for command in commands:
        subprocess.run(command, check=True, capture_output=True)


def _keys(workdir: str, gid: int) -> str:
    """An ssh Secret as Trainer mounts it: ECDSA P-521 as id_rsa, mode 0640, root-owned."""
    keys = os.path.join(workdir, "ssh-auth")
    os.makedirs(keys)
    subprocess.run(
        [
            "ssh-keygen",
            "-q",
            "-t",
            "ecdsa",
            "-b",
            "521",
            "-N",
            "",
            "-C",
            "trainer-launcher-local",
            "-f",
            os.path.join(keys, "id_rsa"),
        ],
        check=True,
    )
    shutil.copy(os.path.join(keys, "id_rsa.pub"), os.path.join(keys, "authorized_keys"))
    for name, mode in (("id_rsa", 0o640), ("id_rsa.pub", 0o644), ("authorized_keys", 0o644)):
        os.chown(os.path.join(keys, name), 0, gid)
        os.chmod(os.path.join(keys, name), mode)
    os.chmod(keys, 0o755)
    return keys


class Cluster:
    """The job's pods on this machine, in this process's private network: the Secret, the hosts
    file and the hostfile written once; each pod's command line made on demand. A pod made again
    is a replacement, as a Job controller starts one: the same name and address, a new state
    directory."""

    def __init__(
        self,
        workdir: str,
        implementation: str,
        nnodes: int,
        slots: int,
        trainjob: str,
        account: pwd.struct_passwd,
        knobs: list[str],
    ):
        self.workdir, self.implementation, self.account, self.knobs = workdir, implementation, account, knobs
        _private_network(nnodes, on_interface=implementation == "openmpi")
        self.keys = _keys(workdir, account.pw_gid)
        self.workers = [f"{trainjob}-node-0-{i}" for i in range(nnodes)]
        self.launcher_pod = f"{trainjob}-launcher-0-0"
        self.hosts = os.path.join(workdir, "hosts")
        with open("/etc/hosts") as current, open(self.hosts, "w") as private:
            private.write(current.read().rstrip() + "\n")
            private.write(f"{LAUNCHER_IP} {self.launcher_pod} {self.launcher_pod}.{trainjob}\n")
            private.writelines(f"{worker_ip(i)} {pod} {pod}.{trainjob}\n" for i, pod in enumerate(self.workers))
        self.hostfile = os.path.join(workdir, "hostfile")  # what the controller's ConfigMap holds
        with open(self.hostfile, "w") as handle:
            handle.writelines(f"{pod}.{trainjob} slots={slots}\n" for pod in self.workers)
        os.chmod(self.hosts, 0o644)
        os.chmod(self.hostfile, 0o644)
        self.base = {k: v for k, v in settings.environ().items() if not k.startswith(("OMPI_", "PRTE_", "PMIX_"))}
        self.base.update(
            {
                "HOME": account.pw_dir,
                "USER": account.pw_name,
                "LOGNAME": account.pw_name,
                # Open MPI may only use the cluster interface (it skips loopback-only hosts).
                "OMPI_MCA_btl_tcp_if_include": INTERFACE,
                "OMPI_MCA_oob_tcp_if_include": INTERFACE,
                "PRTE_MCA_oob_tcp_if_include": INTERFACE,
            }
        )

    def worker(self, index: int) -> tuple[str, list[str], dict[str, str]]:
        """Worker pod ``index``: its name, command line and environment."""
        pod = self.workers[index]
        state = self._pod_dir(pod)
        role = ["--worker", *self.knobs, "--ssh-listen-address", worker_ip(index)]
        return pod, self._enter(pod, state, role), self._env(pod, state)

    def launcher(self, rest: list[str]) -> tuple[str, list[str], dict[str, str]]:
        """The launcher pod, running ``rest`` under mpirun."""
        pod = self.launcher_pod
        state = self._pod_dir(pod)
        role = ["--implementation", self.implementation, *self.knobs, "--hostfile", self.hostfile, "--", *rest]
        return pod, self._enter(pod, state, role), self._env(pod, state)

    def _env(self, pod: str, state: str) -> dict[str, str]:
        return {**self.base, "HOSTNAME": pod, "LAUNCHER_TERMINATION_LOG": os.path.join(state, "termination.json")}

    def _pod_dir(self, pod: str) -> str:
        path = tempfile.mkdtemp(prefix=f"{pod}.", dir=self.workdir)
        os.chown(path, self.account.pw_uid, self.account.pw_gid)
        return path

    def _enter(self, pod: str, state: str, role: list[str]) -> list[str]:
        """``trainer-launcher mpi`` in the pod's namespaces, as its user; ``role``'s words go first
        (the launcher's program last)."""
        account = self.account
        drop = ["setpriv", f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}", "--init-groups", "--"]
        mounts = ["--ssh-auth-mount-path", self.keys, "--ssh-dir", state]
        split = role.index("--") if "--" in role else len(role)
        argv = [sys.executable, "-m", "launcher", "mpi", *role[:split], *mounts, *role[split:]]
        return [*UNSHARE_NODE, "sh", "-c", _ENTER_POD, self.hosts, self.keys, pod, *drop, *argv]


def _run(
    launcher: LauncherSettings,
    launcher_overrides,
    mpi_overrides,
    rest,
    implementation: str,
    nnodes: int,
    slots: int,
    trainjob: str,
    account: pwd.struct_passwd,
) -> Outcome:
    workdir = tempfile.mkdtemp(prefix="trainer-launcher-local-mpi-")
    os.chmod(workdir, 0o755)
    try:
        knobs = [
            a
            for o in (*launcher_overrides.values(), *mpi_overrides.values())
            if o.source != "--termination-log"
            for a in (o.source, str(o.value))
        ]
        cluster = Cluster(workdir, implementation, nnodes, slots, trainjob, account, knobs)
        log.info(
            f"local: MPI ({implementation}) on {nnodes} worker pods x {slots} slots and a launcher pod, "
            f"ssh as {account.pw_name}"
        )
        with Supervisor(launcher.grace_period) as supervisor:
            for index in range(nnodes):
                pod, argv, env = cluster.worker(index)
                supervisor.spawn(pod, argv, env, transform=_prefix(pod))
            pod, argv, env = cluster.launcher(rest)
            main = supervisor.spawn(pod, argv, env, transform=_prefix(pod), primary=True)
            supervisor.run()
        return _outcome(supervisor, main, env["LAUNCHER_TERMINATION_LOG"], launcher)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _prefix(pod: str):
    def transform(line: str) -> str:
        return f"[{pod}] {line}"

    return transform


def _outcome(supervisor: Supervisor, main, termination: str, launcher: LauncherSettings) -> Outcome:
    """The launcher pod's outcome is the job's; workers only ever stop because we stopped them."""
    import json

    if main.returncode == 0:
        return success()
    try:
        with open(termination) as handle:
            return Outcome.from_json(json.load(handle))
    except (OSError, ValueError, KeyError):
        pass
    if supervisor.received_signal is not None:
        return terminated(supervisor.received_signal)
    return classify(main.returncode, retryable_codes=launcher.retryable_exit_codes, what="the launcher pod")
