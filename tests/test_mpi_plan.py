"""The MPI planning code, in-process and table-driven: hostfile parsing and rendering, mpirun
argument splitting, the export list, ``python -m mpi4py``, the plan for each MPI implementation,
``--version`` detection, root causes read from mpirun's output, and the ssh files.

Everything here is pure except ``install_keys`` (which writes into ``tmp_path``); nothing runs an
MPI, an sshd or a subprocess.
"""

from __future__ import annotations

import json
import os
import stat
from collections import deque
from pathlib import Path

import pytest

from launcher.core import settings
from launcher.mpi import ssh
from launcher.mpi.detect import MpiImpl, parse_version
from launcher.mpi.hostfile import MAX_SLOTS, Host, parse_hostfile, render, uniform_slots
from launcher.mpi.plan import (
    MpiFacts,
    MpiPlan,
    abort_on_exception,
    exported_names,
    hostfile_option,
    known_hosts_text,
    plan_mpi,
    split_mpirun_args,
)
from launcher.mpi.job import _root_cause_from_output, host_key_refused, refused_host
from launcher.core.outcome import DEFAULT_RETRYABLE_EXIT_CODES, ConfigError, RootCause, is_retryable
from launcher.core.settings import Override
from launcher.mpi.settings import MpiSettings
from launcher.core.supervisor import Child

IS_ROOT = os.geteuid() == 0
MPI_PREFIXES = ("LAUNCHER_", "OMPI_", "PRTE_", "I_MPI_", "HYDRA_")

N0, N1, N2 = "tj-node-0-0.tj", "tj-node-0-1.tj", "tj-node-0-2.tj"
UNIFORM = (Host(N0, 2), Host(N1, 2))
MIXED = (Host(N0, 2), Host(N1, 4))


def facts(is_root: bool = False, hostname: str = "tj-launcher-0-0", has_mpi4py: bool = True) -> MpiFacts:
    return MpiFacts(is_root=is_root, hostname=hostname, python="/usr/bin/python3", has_mpi4py=has_mpi4py)


# =============================================================================================
# parse_hostfile
# =============================================================================================

GOOD_HOSTFILES = [
    pytest.param("tj-node-0-0.tj slots=2\ntj-node-0-1.tj slots=2\n", None,
                 (Host(N0, 2), Host(N1, 2)), id="trainer-openmpi-format"),
    pytest.param("tj-node-0-0.tj:4\ntj-node-0-1.tj:4\n", None,
                 (Host(N0, 4), Host(N1, 4)), id="hydra-format"),
    pytest.param("tj-node-0-0.tj slots=2\ntj-node-0-1.tj:3\n", None,
                 (Host(N0, 2), Host(N1, 3)), id="both-formats-mixed"),
    pytest.param("# the Trainer's hostfile\n\ntj-node-0-0.tj slots=2  # the launcher\n   \n"
                 "   tj-node-0-1.tj   slots=8   \n# end\n", None,
                 (Host(N0, 2), Host(N1, 8)), id="comments-blanks-and-spaces"),
    pytest.param("tj-node-0-0.tj:2 # trailing comment after hydra\n", None,
                 (Host(N0, 2),), id="hydra-trailing-comment"),
    pytest.param("tj-node-0-0.tj slots=2 max_slots=4\n", None, (Host(N0, 2),), id="max-slots-accepted"),
    pytest.param("tj-node-0-0.tj max_slots=4\n", 3, (Host(N0, 3),), id="max-slots-alone-uses-default"),
    pytest.param("tj-node-0-0.tj\ntj-node-0-1.tj slots=5\n", 3,
                 (Host(N0, 3), Host(N1, 5)), id="no-count-gets-default-slots"),
    pytest.param("tj-node-0-0.tj\n", None, (Host(N0, 1),), id="no-count-no-default-is-1"),
    pytest.param("10.0.0.1 slots=2\n10.0.0.2:2\n", None,
                 (Host("10.0.0.1", 2), Host("10.0.0.2", 2)), id="ipv4-both-formats"),
    pytest.param(f"tj-node-0-0.tj slots={MAX_SLOTS}\n", None, (Host(N0, MAX_SLOTS),), id="max-slots-limit"),
    pytest.param("tj-node-0-0.tj slots=2\r\ntj-node-0-1.tj slots=2\r\n", None,
                 (Host(N0, 2), Host(N1, 2)), id="crlf-line-endings"),
    pytest.param("localhost slots=1\n", None, (Host("localhost", 1),), id="single-label-name"),
]


@pytest.mark.parametrize("text, default_slots, expected", GOOD_HOSTFILES)
def test_parse_hostfile(text, default_slots, expected):
    assert parse_hostfile(text, "/etc/mpi/hostfile", default_slots) == expected


BAD_HOSTFILES = [
    # (text, line number that must be named (None: just the source), the offending line)
    pytest.param("", None, None, id="empty-file"),
    pytest.param("# only a comment\n\n   # another\n", None, None, id="only-comments"),
    pytest.param("\n\n\n", None, None, id="only-blank-lines"),
    pytest.param("tj-node-0-0.tj slots=2\nTJ-NODE-0-0.TJ slots=2\n", 2, "TJ-NODE-0-0.TJ slots=2",
                 id="duplicate-host-case-insensitive"),
    pytest.param("tj-node-0-0.tj slots=2\ntj-node-0-0.tj:2\n", 2, "tj-node-0-0.tj:2",
                 id="duplicate-host-across-formats"),
    pytest.param("tj-node-0-0.tj slots=0\n", 1, "tj-node-0-0.tj slots=0", id="slots-zero"),
    pytest.param("tj-node-0-0.tj slots=-1\n", 1, "tj-node-0-0.tj slots=-1", id="slots-negative"),
    pytest.param("tj-node-0-0.tj slots=abc\n", 1, "tj-node-0-0.tj slots=abc", id="slots-word"),
    pytest.param("tj-node-0-0.tj slots=99999\n", 1, "tj-node-0-0.tj slots=99999", id="slots-too-many"),
    pytest.param("tj-node-0-0.tj slots=\n", 1, "tj-node-0-0.tj slots=", id="slots-empty"),
    pytest.param("tj-node-0-0.tj slots=2.5\n", 1, "tj-node-0-0.tj slots=2.5", id="slots-float"),
    pytest.param("# header\ntj-node-0-0.tj:0\n", 2, "tj-node-0-0.tj:0", id="hydra-zero"),
    pytest.param("tj-node-0-0.tj:x\n", 1, "tj-node-0-0.tj:x", id="hydra-word"),
    pytest.param("tj-node-0-0.tj:\n", 1, "tj-node-0-0.tj:", id="hydra-empty-count"),
    pytest.param("tj-node-0-0.tj: 2\n", 1, "tj-node-0-0.tj: 2", id="hydra-extra-field"),
    pytest.param("tj-node-0-0.tj:2 slots=2\n", 1, "tj-node-0-0.tj:2 slots=2", id="hydra-plus-slots"),
    pytest.param("tj-node-0-0.tj slots=2 foo=bar\n", 1, "tj-node-0-0.tj slots=2 foo=bar", id="unknown-option"),
    pytest.param("tj-node-0-0.tj 2\n", 1, "tj-node-0-0.tj 2", id="bare-count"),
    pytest.param("tj-node-0-1.tj slots=1\nbad_host! slots=1\n", 2, "bad_host! slots=1", id="bad-host-name"),
    pytest.param("-tj-node slots=1\n", 1, "-tj-node slots=1", id="host-leading-dash"),
    # Unicode digits pass str.isdigit() but not always int(): must still be one ConfigError.
    pytest.param("tj-node-0-0.tj:\u00b2\n", 1, "tj-node-0-0.tj:\u00b2", id="superscript-digit"),
    # int() refuses strings over 4300 digits (ValueError, not a bad count): must still be a ConfigError.
    pytest.param("tj-node-0-0.tj slots=" + "9" * 5000 + "\n", 1, "tj-node-0-0.tj slots=999", id="count-5000-digits"),
]


@pytest.mark.parametrize("text, line, quoted", BAD_HOSTFILES)
def test_parse_hostfile_rejects(text, line, quoted):
    source = "/etc/mpi/hostfile"
    with pytest.raises(ConfigError) as raised:
        parse_hostfile(text, source)
    message = str(raised.value)
    assert raised.value.exit_code == 2
    assert "\n" not in message, message
    if line is None:
        assert message.startswith(source), message
    else:
        assert f"{source}:{line}" in message, message
        assert quoted in message, message


def test_parse_hostfile_names_the_source_it_was_given():
    with pytest.raises(ConfigError, match=r"^/mnt/x/hosts:3="):
        parse_hostfile("a slots=1\nb slots=1\nc slots=0\n", "/mnt/x/hosts")


# =============================================================================================
# render / uniform_slots
# =============================================================================================

RENDER_CASES = [
    pytest.param(UNIFORM, "openmpi", f"{N0} slots=2\n{N1} slots=2\n", id="openmpi-uniform"),
    pytest.param(MIXED, "openmpi", f"{N0} slots=2\n{N1} slots=4\n", id="openmpi-mixed"),
    pytest.param(UNIFORM, "hydra", f"{N0}:2\n{N1}:2\n", id="hydra-uniform"),
    pytest.param(MIXED, "hydra", f"{N0}:2\n{N1}:4\n", id="hydra-mixed"),
    pytest.param((Host("10.0.0.1", 1),), "hydra", "10.0.0.1:1\n", id="hydra-ipv4"),
]


@pytest.mark.parametrize("hosts, flavor, expected", RENDER_CASES)
def test_render(hosts, flavor, expected):
    assert render(hosts, flavor) == expected


@pytest.mark.parametrize("flavor", ["openmpi", "hydra"])
@pytest.mark.parametrize("hosts", [UNIFORM, MIXED, (Host("10.0.0.1", 7),), (Host("localhost", MAX_SLOTS),)],
                         ids=["uniform", "mixed", "ipv4", "max"])
def test_render_round_trips(hosts, flavor):
    assert parse_hostfile(render(hosts, flavor), "rendered") == hosts


@pytest.mark.parametrize("hosts, expected", [
    pytest.param(UNIFORM, 2, id="uniform"),
    pytest.param(MIXED, None, id="mixed"),
    pytest.param((Host(N0, 5),), 5, id="single"),
    pytest.param((Host(N0, 2), Host(N1, 2), Host(N2, 3)), None, id="last-differs"),
])
def test_uniform_slots(hosts, expected):
    assert uniform_slots(hosts) == expected


# =============================================================================================
# split_mpirun_args
# =============================================================================================

SPLIT_CASES = [
    pytest.param(["-np", "4", "python", "x.py"], ("-np", "4"), ("python", "x.py"), id="np"),
    pytest.param(["--mca", "btl", "tcp,self", "--oversubscribe", "python3", "-m", "pkg"],
                 ("--mca", "btl", "tcp,self", "--oversubscribe"), ("python3", "-m", "pkg"), id="mca-two-values-then-switch"),
    pytest.param(["-genv", "A", "1", "-n", "2", "./a.out", "--flag"],
                 ("-genv", "A", "1", "-n", "2"), ("./a.out", "--flag"), id="genv-two-values"),
    pytest.param(["--map-by=ppr:1:node", "prog"], ("--map-by=ppr:1:node",), ("prog",), id="equals-form"),
    pytest.param(["--", "prog", "-x"], (), ("prog", "-x"), id="explicit-separator"),
    pytest.param(["-np", "2", "--", "prog", "-x"], ("-np", "2"), ("prog", "-x"), id="flags-then-separator"),
    pytest.param(["-x", "NCCL_DEBUG", "--bind-to", "none", "python3", "t.py"],
                 ("-x", "NCCL_DEBUG", "--bind-to", "none"), ("python3", "t.py"), id="one-value-flags"),
    pytest.param(["prog", "-np", "4", "--verbose", "--", "y"], (), ("prog", "-np", "4", "--verbose", "--", "y"),
                 id="program-args-that-look-like-flags"),
    pytest.param(["-n", "2", "python3", "-u", "x.py", "--lr", "0.1"], ("-n", "2"),
                 ("python3", "-u", "x.py", "--lr", "0.1"), id="python-flags-stay-with-program"),
    pytest.param(["--oversubscribe"], ("--oversubscribe",), (), id="only-a-switch"),
    pytest.param(["-np", "4"], ("-np", "4"), (), id="only-flags"),
    pytest.param([], (), (), id="empty"),
]


@pytest.mark.parametrize("args, flags, program", SPLIT_CASES)
def test_split_mpirun_args(args, flags, program):
    assert split_mpirun_args(args) == (flags, program)


# =============================================================================================
# exported_names
# =============================================================================================

DENIED = {
    "HOSTNAME": "tj-launcher-0-0", "HOME": "/root", "PWD": "/work", "OLDPWD": "/", "SHLVL": "1",
    "USER": "root", "LOGNAME": "root", "SHELL": "/bin/sh", "TERM": "xterm", "_": "/usr/bin/env",
    "SSH_AUTH_SOCK": "/tmp/agent", "SSH_CONNECTION": "x",
    "CUDA_VISIBLE_DEVICES": "0", "NVIDIA_VISIBLE_DEVICES": "all",
    "OMPI_MCA_x": "1", "PRTE_MCA_x": "1", "PMIX_x": "1", "PMI_RANK": "0",
    "HYDRA_x": "1", "I_MPI_HYDRA_x": "1", "LAUNCHER_x": "1",
    "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "1", "JOB_COMPLETION_INDEX": "0", "TMPDIR": "/tmp",
}
KEPT = {
    "PATH": "/usr/bin", "LD_LIBRARY_PATH": "/opt/lib", "PYTHONPATH": "/app", "NCCL_DEBUG": "INFO",
    "NCCL_SOCKET_IFNAME": "eth0", "MY_FLAG": "1", "OMP_NUM_THREADS": "4", "I_MPI_DEBUG": "5", "FOO": "bar",
}
NOT_IDENTIFIERS = {"BASH_FUNC_x%%": "() { :; }", "1BAD": "x", "A-B": "x", "A.B": "x", "": "x"}
ENVIRON = {**DENIED, **KEPT, **NOT_IDENTIFIERS}

EXPORT_CASES = [
    pytest.param(("*",), (), tuple(sorted(KEPT)), id="default-exports-all-but-deny-list"),
    pytest.param(("NCCL_*", "MY_FLAG"), (), ("MY_FLAG", "NCCL_DEBUG", "NCCL_SOCKET_IFNAME"), id="allow-globs"),
    pytest.param(("NCCL_*", "HOME", "OMPI_*", "CUDA_VISIBLE_DEVICES"), (), ("NCCL_DEBUG", "NCCL_SOCKET_IFNAME"),
                 id="deny-list-beats-allow"),
    pytest.param(("*",), ("NCCL_*", "FOO"), tuple(sorted(set(KEPT) - {"NCCL_DEBUG", "NCCL_SOCKET_IFNAME", "FOO"})),
                 id="extra-deny"),
    pytest.param(("BASH_FUNC_*", "A*", "1*"), (), (), id="non-identifiers-never"),
    pytest.param(("NOTHING_*",), (), (), id="no-match"),
]


@pytest.mark.parametrize("allow, deny, expected", EXPORT_CASES)
def test_exported_names(allow, deny, expected):
    result = exported_names(ENVIRON, allow, deny)
    assert result == expected
    assert list(result) == sorted(result)


@pytest.mark.parametrize("name", sorted(DENIED))
def test_built_in_deny_list(name):
    assert name not in exported_names({name: "x", "KEEP": "y"}, ("*",), ())
    assert "KEEP" in exported_names({name: "x", "KEEP": "y"}, ("*",), ())


# =============================================================================================
# abort_on_exception
# =============================================================================================

MPI4PY = ("-m", "mpi4py")
RANK = ("-m", "launcher.mpi.rank")  # python -m mpi4py, plus a failure report to the launcher
ABORT_CASES = [
    pytest.param(("python3", "x.py"), ("python3", *MPI4PY, "x.py"), id="python3-script"),
    pytest.param(("python", "-u", "x.py"), ("python", "-u", *MPI4PY, "x.py"), id="python-u"),
    pytest.param(("python3", "-u", "-X", "dev", "-W", "error", "x.py"),
                 ("python3", "-u", "-X", "dev", "-W", "error", *MPI4PY, "x.py"), id="interpreter-options-with-values"),
    pytest.param(("python3", "-m", "pkg.mod", "a"), ("python3", *MPI4PY, "-m", "pkg.mod", "a"), id="python-m-module"),
    pytest.param(("python3", "-m", "mpi4py", "x.py"), ("python3", "-m", "mpi4py", "x.py"), id="already-mpi4py"),
    pytest.param(("python3", "-u", "-m", "mpi4py", "x.py"), ("python3", "-u", "-m", "mpi4py", "x.py"),
                 id="already-mpi4py-after-u"),
    pytest.param(("x.py", "a"), ("/usr/bin/python3", *RANK, "x.py", "a"), id="bare-script"),
    pytest.param(("./train.py",), ("/usr/bin/python3", *RANK, "./train.py"), id="bare-script-path"),
    # The launcher's own python (facts: /usr/bin/python3), or one beside it, can run launcher.mpi.rank.
    pytest.param(("/usr/bin/python3", "x.py"), ("/usr/bin/python3", *RANK, "x.py"), id="launchers-python"),
    pytest.param(("/usr/bin/python3.11", "-u", "x.py"), ("/usr/bin/python3.11", "-u", *RANK, "x.py"),
                 id="python-beside-the-launchers"),
    pytest.param(("/usr/bin/python3", "-m", "launcher.mpi.rank", "x.py"), ("/usr/bin/python3", *RANK, "x.py"),
                 id="already-rank-runner"),
    pytest.param(("./a.out",), ("./a.out",), id="binary-unchanged"),
    pytest.param(("bash", "-c", "python x.py"), ("bash", "-c", "python x.py"), id="shell-unchanged"),
    pytest.param(("/opt/venv/bin/python3.11", "x.py"), ("/opt/venv/bin/python3.11", *MPI4PY, "x.py"), id="venv-python"),
    pytest.param(("python3", "x.py", "-u", "-m", "y"), ("python3", *MPI4PY, "x.py", "-u", "-m", "y"),
                 id="script-args-untouched"),
    pytest.param(("python3.11-config", "x.py"), ("python3.11-config", "x.py"), id="not-an-interpreter"),
    # An option with its value attached (-Werror, -Xdev) is the interpreter's, not mpi4py's.
    pytest.param(("python3", "-Werror", "x.py"), ("python3", "-Werror", *MPI4PY, "x.py"), id="attached-W-value"),
    pytest.param((), (), id="empty"),
]


@pytest.mark.parametrize("program, expected", ABORT_CASES)
def test_abort_on_exception(program, expected):
    assert abort_on_exception(program, facts(has_mpi4py=True)) == expected


@pytest.mark.parametrize("program", [("python3", "x.py"), ("x.py",), ("python", "-m", "pkg")])
def test_abort_on_exception_needs_mpi4py(program):
    assert abort_on_exception(program, facts(has_mpi4py=False)) == program


# =============================================================================================
# plan_mpi
# =============================================================================================

OMPI5 = MpiImpl("openmpi", 5, "/opt/mpi/openmpi5/bin/mpirun")
OMPI4 = MpiImpl("openmpi", 4, "mpirun")
INTEL = MpiImpl("intel", 2021, "mpirun")
MPICH = MpiImpl("mpich", 4, "mpiexec")
IMPLS = [pytest.param(OMPI5, id="openmpi5"), pytest.param(OMPI4, id="openmpi4"),
         pytest.param(INTEL, id="intel"), pytest.param(MPICH, id="mpich")]
OPENMPIS = [pytest.param(OMPI5, id="openmpi5"), pytest.param(OMPI4, id="openmpi4")]
HYDRAS = [pytest.param(INTEL, id="intel"), pytest.param(MPICH, id="mpich")]
PLAN_ENVIRON = {"FOO": "1", "HOME": "/root", "NCCL_DEBUG": "INFO", "PATH": "/usr/bin", "OMPI_MCA_x": "1"}
PROGRAM = ["python3", "x.py"]


@pytest.fixture
def ssh_dir(monkeypatch, tmp_path: Path) -> Path:
    """A clean MPI environment whose LAUNCHER_SSH_DIR is under tmp_path."""
    for name in list(os.environ):
        if name.startswith(MPI_PREFIXES):
            monkeypatch.delenv(name)
    path = tmp_path / "ssh"
    monkeypatch.setenv("LAUNCHER_SSH_DIR", str(path))
    return path


def mpi_settings(**flags: str) -> MpiSettings:
    """``load(MpiSettings)`` with CLI-style overrides, e.g. ssh_port="2022"."""
    overrides = {name: Override(value, "--" + name.replace("_", "-")) for name, value in flags.items()}
    return settings.load(MpiSettings, overrides)


def make_plan(impl, hosts=UNIFORM, args=PROGRAM, environ=PLAN_ENVIRON, the_facts=None, **flags) -> MpiPlan:
    return plan_mpi(mpi_settings(**flags), impl, hosts, list(args), dict(environ), the_facts or facts())


def pairs(argv) -> list[tuple[str, str]]:
    return list(zip(argv, argv[1:]))


@pytest.mark.parametrize("impl", IMPLS)
def test_plan_paths_live_in_the_ssh_dir(ssh_dir, impl):
    plan = make_plan(impl)
    assert plan.hostfile_path == str(ssh_dir / "hostfile")
    assert plan.ssh_config_path == str(ssh_dir / "ssh_config")
    assert plan.ssh_wrapper_path == str(ssh_dir / "ssh")
    assert plan.argv[0] == impl.launcher
    assert plan.ranks == 4
    assert plan.hosts == UNIFORM
    assert plan.impl == impl


@pytest.mark.parametrize("impl", OPENMPIS)
def test_openmpi_argv(ssh_dir, impl):
    plan = make_plan(impl)
    hostfile = str(ssh_dir / "hostfile")
    assert list(plan.argv[:5]) == [impl.launcher, "--hostfile", hostfile, "-np", "4"]
    assert ("-x", "FOO") in pairs(plan.argv)
    assert ("-x", "NCCL_DEBUG") in pairs(plan.argv)
    assert ("-x", "HOME") not in pairs(plan.argv)
    assert ("-x", "OMPI_MCA_x") not in pairs(plan.argv)
    assert plan.exported == ("FOO", "NCCL_DEBUG", "PATH")
    assert plan.argv[-4:] == ("python3", "-m", "mpi4py", "x.py")


@pytest.mark.parametrize("impl", OPENMPIS)
@pytest.mark.parametrize("hosts, default_slots", [pytest.param(UNIFORM, "2", id="uniform"),
                                                  pytest.param(MIXED, None, id="mixed")])
def test_openmpi_env(ssh_dir, impl, hosts, default_slots):
    plan = make_plan(impl, hosts)
    hostfile, config = str(ssh_dir / "hostfile"), str(ssh_dir / "ssh_config")
    expected = {
        "OMPI_MCA_orte_default_hostfile": hostfile,
        "PRTE_MCA_prte_default_hostfile": hostfile,
        "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
        "PRTE_MCA_prte_keep_fqdn_hostnames": "true",
        "OMPI_MCA_plm_rsh_args": f"-F {config}",
        "PRTE_MCA_plm_ssh_args": f"-F {config}",
    }
    if default_slots:
        expected["OMPI_MCA_orte_set_default_slots"] = default_slots
        expected["PRTE_MCA_prte_set_default_slots"] = default_slots
    assert plan.env_set == expected
    assert plan.ranks == sum(h.slots for h in hosts)
    assert plan.hostfile_text == "".join(f"{h.name} slots={h.slots}\n" for h in hosts)


@pytest.mark.parametrize("impl", OPENMPIS)
@pytest.mark.parametrize("is_root", [True, False])
def test_openmpi_run_as_root_only_when_root(ssh_dir, impl, is_root):
    env = make_plan(impl, the_facts=facts(is_root=is_root)).env_set
    if is_root:
        assert env["OMPI_ALLOW_RUN_AS_ROOT"] == env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] == "1"
    else:
        assert "OMPI_ALLOW_RUN_AS_ROOT" not in env and "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM" not in env


@pytest.mark.parametrize("impl", HYDRAS)
@pytest.mark.parametrize("hosts", [pytest.param(UNIFORM, id="uniform"), pytest.param(MIXED, id="mixed")])
def test_hydra_argv(ssh_dir, impl, hosts):
    plan = make_plan(impl, hosts)
    argv = plan.argv
    total = sum(h.slots for h in hosts)
    assert argv[0] == impl.launcher
    assert ("-f", str(ssh_dir / "hostfile")) in pairs(argv)
    assert ("-n", str(total)) in pairs(argv)
    assert plan.ranks == total
    per_host = uniform_slots(hosts)
    if per_host:
        assert ("-ppn", str(per_host)) in pairs(argv)
    else:
        assert "-ppn" not in argv
    genvlist = argv[argv.index("-genvlist") + 1].split(",")
    assert genvlist == ["FOO", "NCCL_DEBUG", "PATH"]
    assert "-x" not in argv and "--hostfile" not in argv
    assert plan.hostfile_text == "".join(f"{h.name}:{h.slots}\n" for h in hosts)
    assert argv[-4:] == ("python3", "-m", "mpi4py", "x.py")


def test_hydra_no_genvlist_when_nothing_is_exported(ssh_dir):
    plan = make_plan(MPICH, environ={"HOME": "/root"})
    assert "-genvlist" not in plan.argv


@pytest.mark.parametrize("hosts", [pytest.param(UNIFORM, id="uniform"), pytest.param(MIXED, id="mixed")])
def test_intel_env(ssh_dir, hosts):
    plan = make_plan(INTEL, hosts)
    expected = {
        "I_MPI_HYDRA_HOST_FILE": str(ssh_dir / "hostfile"),
        "I_MPI_HYDRA_BOOTSTRAP": "ssh",
        "I_MPI_HYDRA_BOOTSTRAP_EXEC": str(ssh_dir / "ssh"),
    }
    if uniform_slots(hosts):
        expected["I_MPI_PERHOST"] = "2"
    assert plan.env_set == expected


@pytest.mark.parametrize("hosts", [pytest.param(UNIFORM, id="uniform"), pytest.param(MIXED, id="mixed")])
@pytest.mark.parametrize("is_root", [True, False])
def test_mpich_env(ssh_dir, hosts, is_root):
    plan = make_plan(MPICH, hosts, the_facts=facts(is_root=is_root))
    assert plan.env_set == {
        "HYDRA_HOST_FILE": str(ssh_dir / "hostfile"),
        "HYDRA_LAUNCHER": "ssh",
        "HYDRA_LAUNCHER_EXEC": str(ssh_dir / "ssh"),
    }


RANK_FLAGS = ("-n", "-np", "--np")


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("user", [("-n", "3"), ("-np", "3"), ("--np=3",)], ids=["n", "np", "np-equals"])
def test_users_rank_count_suppresses_ours(ssh_dir, impl, user):
    plan = make_plan(impl, args=[*user, "--verbose", "python3", "x.py"])
    assert plan.ranks is None
    argv = plan.argv
    assert sum(argv.count(flag) for flag in RANK_FLAGS) + sum(a.startswith("--np=") for a in argv) == 1
    assert "4" not in argv
    at = argv.index(user[0])
    assert argv[at:at + len(user) + 1] == (*user, "--verbose")
    # the user's flags sit after ours and before the program
    assert at > argv.index(str(ssh_dir / "hostfile"))
    assert argv[-5:] == ("--verbose", "python3", "-m", "mpi4py", "x.py")


@pytest.mark.parametrize("user", [("-c", "3"), ("--n", "3")], ids=["c", "double-dash-n"])
def test_openmpi4_rank_count_synonyms_suppress_ours(ssh_dir, user):
    """Open MPI 4's mpirun --help: ``-c|-np|--np`` and ``-n|--n`` all set the number of processes."""
    plan = make_plan(OMPI4, args=[*user, "python3", "x.py"])
    assert plan.ranks is None
    assert "-np" not in plan.argv
    assert plan.argv[-6:] == (*user, "python3", "-m", "mpi4py", "x.py")


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("abort, has_mpi4py, program", [
    ("1", True, ("python3", "-m", "mpi4py", "x.py", "--lr", "1")),
    ("0", True, ("python3", "x.py", "--lr", "1")),
    ("1", False, ("python3", "x.py", "--lr", "1")),
], ids=["abort", "no-abort", "no-mpi4py"])
def test_plan_program_and_mpi4py(ssh_dir, impl, abort, has_mpi4py, program):
    plan = make_plan(impl, args=["--bind-to", "none", "python3", "x.py", "--lr", "1"],
                     the_facts=facts(has_mpi4py=has_mpi4py), abort_on_exception=abort)
    assert plan.argv[-len(program) - 2:] == ("--bind-to", "none", *program)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("hostname, waited", [
    pytest.param("tj-node-0-0", (N1, N2), id="launcher-as-node-short-name"),
    pytest.param("tj-node-0-0.tj.default.svc.cluster.local", (N1, N2), id="launcher-as-node-fqdn"),
    pytest.param("tj-launcher-0-0", (N0, N1, N2), id="separate-launcher"),
])
def test_wait_hosts_exclude_the_launchers_own_pod(ssh_dir, impl, hostname, waited):
    hosts = (Host(N0, 1), Host(N1, 1), Host(N2, 1))
    plan = make_plan(impl, hosts, the_facts=facts(hostname=hostname))
    assert plan.wait_hosts == waited
    assert plan.hosts == hosts  # the launcher's own pod still runs ranks


@pytest.mark.parametrize("impl, own", [
    pytest.param(OMPI5, "tj-node-0-0", id="openmpi5"), pytest.param(OMPI4, "tj-node-0-0", id="openmpi4"),
    pytest.param(INTEL, N0, id="intel"), pytest.param(MPICH, N0, id="mpich"),
])
def test_the_launchers_own_pod_is_written_by_its_hostname_for_open_mpi(ssh_dir, impl, own):
    # Open MPI takes the DNS name tj-node-0-0.tj for a remote host and would ssh to itself; hydra's
    # remote proxies call back by the listed name, so it must stay resolvable.
    hosts = (Host(N0, 2), Host(N1, 2))
    plan = make_plan(impl, hosts, the_facts=facts(hostname="tj-node-0-0"))
    assert [h.name for h in parse_hostfile(plan.hostfile_text, "rendered")] == [own, N1]
    assert plan.hosts == hosts  # root causes still name the Trainer's hosts


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("flags, env, port", [
    pytest.param({}, {}, 2222, id="default"),
    pytest.param({"ssh_port": "2022"}, {}, 2022, id="flag"),
    pytest.param({}, {"LAUNCHER_SSH_PORT": "2200"}, 2200, id="env"),
    pytest.param({"ssh_port": "2022"}, {"LAUNCHER_SSH_PORT": "2200"}, 2022, id="flag-wins"),
])
def test_ssh_port(ssh_dir, monkeypatch, impl, flags, env, port):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    plan = make_plan(impl, **flags)
    assert plan.ssh_port == port
    assert f"Port {port}\n" in plan.ssh_config_text
    assert plan.to_json()["wait"]["port"] == port
    assert plan.to_json()["ssh"]["port"] == port


@pytest.mark.parametrize("impl", IMPLS)
def test_ssh_client_files(ssh_dir, impl):
    plan = make_plan(impl)
    config = plan.ssh_config_text
    lines = {line.strip() for line in config.splitlines()}
    for expected in ("Port 2222", f"IdentityFile {ssh_dir / 'id_key'}", "BatchMode yes"):
        assert expected in lines, config
    assert any(line.startswith("ConnectionAttempts ") for line in lines), config
    wrapper = plan.ssh_wrapper_text
    assert wrapper.startswith("#!/bin/sh\n")
    assert f'exec ssh -F "{ssh_dir / "ssh_config"}" "$@"' in wrapper


def ssh_options(config: str) -> dict[str, str]:
    return dict(line.strip().split(" ", 1) for line in config.splitlines()[2:] if line.strip())


@pytest.mark.parametrize("impl", IMPLS)
def test_by_default_ssh_accepts_only_the_secrets_key_pinned_in_the_ssh_dir(ssh_dir, impl):
    plan = make_plan(impl)
    options = ssh_options(plan.ssh_config_text)
    assert plan.known_hosts_path == str(ssh_dir / "known_hosts")
    assert options["StrictHostKeyChecking"] == "yes"
    assert options["UserKnownHostsFile"] == plan.known_hosts_path
    # nothing but the pin: no image-wide file, no address entries, nothing ssh adds by itself
    assert options["GlobalKnownHostsFile"] == "/dev/null"
    assert (options["CheckHostIP"], options["UpdateHostKeys"]) == ("no", "no")
    assert plan.to_json()["ssh"]["knownHosts"] == plan.known_hosts_path


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("flags, env", [
    pytest.param({"ssh_host_key_checking": "off"}, {}, id="flag"),
    pytest.param({}, {"LAUNCHER_SSH_HOST_KEY_CHECKING": "OFF"}, id="env"),
])
def test_with_host_key_checking_off_ssh_accepts_any_host_key_as_before(ssh_dir, monkeypatch, impl, flags, env):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    plan = make_plan(impl, **flags)
    options = ssh_options(plan.ssh_config_text)
    assert plan.known_hosts_path is None and plan.to_json()["ssh"]["knownHosts"] is None
    assert (options["StrictHostKeyChecking"], options["UserKnownHostsFile"]) == ("no", "/dev/null")
    assert "GlobalKnownHostsFile" not in options


def test_a_flag_wins_over_the_env_for_host_key_checking(ssh_dir, monkeypatch):
    monkeypatch.setenv("LAUNCHER_SSH_HOST_KEY_CHECKING", "off")
    assert make_plan(OMPI5, ssh_host_key_checking="pinned").known_hosts_path == str(ssh_dir / "known_hosts")


def test_an_unknown_host_key_checking_is_a_one_line_config_error(ssh_dir):
    with pytest.raises(ConfigError) as raised:
        mpi_settings(ssh_host_key_checking="yes")
    assert "--ssh-host-key-checking='yes'" in str(raised.value) and "pinned, off" in str(raised.value)


P521 = "ecdsa-sha2-nistp521 AAAAE2VjZHNhLXNoYTItbmlzdHA1MjE="


@pytest.mark.parametrize("public_key", [
    pytest.param(f"{P521} trainer@tj\n", id="with-comment"),
    pytest.param(f"{P521}\n", id="no-comment"),
    pytest.param(f"  {P521}  \n", id="spaces"),
    pytest.param(f"{P521} a comment with spaces\r\n", id="crlf"),
])
def test_known_hosts_pins_the_secrets_key_for_every_host_and_port(public_key):
    lines = known_hosts_text(public_key).splitlines()
    assert lines[0].startswith("#")
    # "*" matches "[tj-node-0-1.tj]:2222", the name ssh looks up for a port other than 22
    assert lines[1:] == [f"* {P521}"]


@pytest.mark.parametrize("public_key", ["", "\n", "ecdsa-sha2-nistp521\n", "not a key!\n", "ECDSA AAAA\n",
                                        "ecdsa-sha2-nistp521 AAAA$$$\n"])
def test_known_hosts_refuses_what_is_not_a_public_key(public_key):
    with pytest.raises(ValueError, match="public key"):
        known_hosts_text(public_key)


def test_the_hydra_ssh_wrapper_drops_intel_mpis_quiet_flag(ssh_dir):
    """-q would silence ssh's refusal of a host key (Intel MPI runs ``ssh -q -x HOST ...``)."""
    wrapper = make_plan(INTEL).ssh_wrapper_text.splitlines()
    assert wrapper[1] == 'if [ "$1" = -q ]; then shift; fi'


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("args", [[], ["-np", "2"], ["--mca", "btl", "self"], ["--"], ["-n", "2", "--"]],
                         ids=["empty", "only-np", "only-mca", "only-separator", "flags-then-separator"])
def test_plan_without_a_program_is_a_config_error(ssh_dir, impl, args):
    with pytest.raises(ConfigError, match="PROGRAM") as raised:
        make_plan(impl, args=args)
    assert raised.value.exit_code == 2


@pytest.mark.parametrize("impl", IMPLS)
def test_plan_to_json(ssh_dir, impl):
    plan = plan_mpi(mpi_settings(), impl, MIXED, PROGRAM, dict(PLAN_ENVIRON), facts(), {"hostfile": "--hostfile"})
    data = json.loads(json.dumps(plan.to_json()))
    assert data["framework"] == "mpi"
    assert data["implementation"] == {"name": impl.name, "major": impl.major, "launcher": impl.launcher}
    assert data["hosts"] == [{"name": N0, "slots": 2}, {"name": N1, "slots": 4}]
    assert data["ranks"] == 6
    assert data["argv"] == list(plan.argv)
    assert data["env"]["set"] == plan.env_set
    assert data["env"]["exported"] == list(plan.exported)
    assert data["hostfile"] == {"path": plan.hostfile_path, "text": plan.hostfile_text}
    assert data["sources"] == {"hostfile": "--hostfile"}


def test_plan_with_user_rank_count_to_json(ssh_dir):
    data = json.loads(json.dumps(make_plan(MPICH, args=["-n", "1", "a.out"]).to_json()))
    assert data["ranks"] is None


def test_plan_honours_export_settings(ssh_dir):
    plan = make_plan(OMPI5, environ={**PLAN_ENVIRON, "NCCL_ALGO": "ring"}, export="NCCL_*,FOO", export_deny="NCCL_ALGO")
    assert plan.exported == ("FOO", "NCCL_DEBUG")


# =============================================================================================
# detect.parse_version
# =============================================================================================

VERSION_CASES = [
    pytest.param("mpirun (Open MPI) 5.0.11\n\nReport bugs to https://www.open-mpi.org/community/help/\n",
                 ("openmpi", 5), id="openmpi5"),
    pytest.param("mpirun (Open MPI) 4.1.4\n\nReport bugs to http://www.open-mpi.org/community/help/\n",
                 ("openmpi", 4), id="openmpi4"),
    pytest.param("mpiexec (Open MPI) 4.0.3\n", ("openmpi", 4), id="openmpi-mpiexec-name"),
    pytest.param("Intel(R) MPI Library for Linux* OS, Version 2021.19 Build 20250515 (id: abc)\n"
                 "Copyright 2003-2025, Intel Corporation.\n", ("intel", 2021), id="intel"),
    pytest.param("HYDRA build details:\n"
                 "    Version:                                 4.0.2\n"
                 "    Release Date:                            Thu Mar  3 11:26:30 CST 2022\n"
                 "    CC:                              gcc\n", ("mpich", 4), id="mpich"),
    pytest.param("bash: mpirun: command not found\n", None, id="unknown"),
    pytest.param("", None, id="empty"),
]


@pytest.mark.parametrize("text, expected", VERSION_CASES)
def test_parse_version(text, expected):
    assert parse_version(text) == expected


# =============================================================================================
# mpi_job._root_cause_from_output
# =============================================================================================

OMPI_ABORT = [
    "--------------------------------------------------------------------------",
    "MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD",
    "with errorcode 3.",
    "",
    "NOTE: invoking MPI_ABORT causes Open MPI to kill all MPI processes.",
    "--------------------------------------------------------------------------",
]
HYDRA_ABORT = ["Abort(3) on node 1 (rank 1 in comm 0): application called MPI_Abort(MPI_COMM_WORLD, 3) - process 1"]
HYDRA_BANNER = [
    "===================================================================================",
    "=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES",
    "=   PID 4242 RUNNING AT tj-node-0-1.tj",
    "=   EXIT CODE: 9",
    "=   CLEANING UP REMAINING PROCESSES",
    "=   YOU CAN IGNORE THE BELOW CLEANUP MESSAGES",
    "===================================================================================",
]
# A rank SIGKILL ended: the banner's exit code is the signal's number, and this line says so.
HYDRA_KILLED = [*HYDRA_BANNER, "YOUR APPLICATION TERMINATED WITH THE EXIT STRING: Killed (signal 9)"]
OMPI5_EXITED = [
    "prterun detected that one or more processes exited with non-zero status,",
    "thus causing the job to be terminated. The first process to do so was:",
    "",
    "   Process name: [prterun-tj-launcher-0-0-4943@1,3]",
    "   Exit code:    3",
]
OMPI4_EXITED = [
    "mpirun detected that one or more processes exited with non-zero status, thus causing",
    "the job to be terminated. The first process to do so was:",
    "",
    "  Process name: [[35711,1],12]",
    "  Exit code:    3",
]
OMPI_SIGNAL = ["mpirun noticed that process rank 0 with PID 0 on node tj-node-0-2 exited on signal 9 (Killed)."]
NOISE = ["epoch 1 loss 0.5", "Traceback (most recent call last):", "ValueError: boom"]

ROOT_CAUSE_CASES = [
    pytest.param(OMPI_ABORT, 1, None, id="openmpi-mpi-abort"),
    pytest.param(NOISE + HYDRA_ABORT, 1, None, id="hydra-mpi-abort"),
    pytest.param(["Abort(1) on node 7 (rank 7 in comm 0): application called MPI_Abort(MPI_COMM_WORLD, 1)"],
                 7, None, id="hydra-mpi-abort-rank-7"),
    pytest.param(HYDRA_BANNER, None, "tj-node-0-1.tj", id="hydra-bad-termination"),
    pytest.param(HYDRA_ABORT + HYDRA_BANNER, 1, "tj-node-0-1.tj", id="hydra-abort-and-banner"),
    pytest.param(OMPI_SIGNAL, 0, "tj-node-0-2", id="openmpi-signal"),
    pytest.param(HYDRA_KILLED, None, "tj-node-0-1.tj", id="hydra-signal"),
    pytest.param(NOISE + OMPI5_EXITED, 3, None, id="openmpi5-first-nonzero-exit"),
    pytest.param(OMPI4_EXITED, 12, None, id="openmpi4-first-nonzero-exit"),
]


def child_with(lines) -> Child:
    child = Child(name="mpirun", pid=1, popen=None)
    for line in lines:
        child.tail.append(line)
    return child


@pytest.mark.parametrize("lines, rank, node", ROOT_CAUSE_CASES)
def test_root_cause_from_output(lines, rank, node):
    before = RootCause(node="launcher-pod", exit_code=3)
    after = _root_cause_from_output(child_with(lines), before)
    assert after.rank == rank
    assert after.node == node
    if lines in (OMPI_SIGNAL, HYDRA_KILLED):  # the rank a signal ended: judged by its signal (launcher/core/judge.py)
        assert (after.signal, after.exit_code) == ("SIGKILL", None)
    else:
        assert after.exit_code == 3  # what supervise knew is kept


SSH_CHANGED = [
    "@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@",
    "@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @",
    "Offending ECDSA key in /home/mpiuser/.trainer-launcher/ssh/known_hosts:2",
    "Host key for [tj-node-0-1.tj]:2222 has changed and you have requested strict checking.",
    "Host key verification failed.",
]


@pytest.mark.parametrize("lines, host", [
    pytest.param(SSH_CHANGED, "tj-node-0-1.tj", id="same-type-other-key"),
    pytest.param(["No ED25519 host key is known for [tj-node-0-2.tj]:2222 and you have requested strict checking.",
                  "Host key verification failed."], "tj-node-0-2.tj", id="key-of-another-type"),
    pytest.param(["Host key for tj-node-0-1.tj has changed and you have requested strict checking."],
                 "tj-node-0-1.tj", id="port-22"),
    pytest.param(["[local-launcher-0-0] Host key for [10.0.0.7]:2222 has changed and you have requested strict "
                  "checking."], "10.0.0.7", id="prefixed-address"),
    pytest.param(NOISE + ["Host key verification failed."], None, id="unnamed"),
])
def test_the_host_whose_key_ssh_refused_is_read_from_its_own_words(lines, host):
    assert refused_host(lines) == host


@pytest.mark.parametrize("host", ["tj-node-0-1.tj", None])
def test_a_refused_host_key_is_one_permanent_line_naming_the_host(host):
    outcome = host_key_refused(host)
    assert (outcome.exit_code, outcome.reason) == (2, "HostKeyMismatch")
    assert not is_retryable(outcome.exit_code, DEFAULT_RETRYABLE_EXIT_CODES)
    assert "\n" not in outcome.message and "does not match the mounted Secret's key" in outcome.message
    assert "LAUNCHER_SSH_HOST_KEY_CHECKING=off" in outcome.message
    if host:
        assert outcome.message.startswith(f"ssh refused {host}:") and outcome.root_cause.node == host


@pytest.mark.parametrize("lines", [[], NOISE, ["rank 1 finished", "node tj-node-0-1 ok"]], ids=["empty", "noise", "near-miss"])
def test_root_cause_unchanged_without_a_known_message(lines):
    before = RootCause(node="launcher-pod", exit_code=1)
    assert _root_cause_from_output(child_with(lines), before) == before


def test_root_cause_reads_only_the_tail():
    child = child_with(OMPI_ABORT)
    assert isinstance(child.tail, deque)
    for _ in range(child.tail.maxlen):
        child.tail.append("noise")
    before = RootCause(node="launcher-pod")
    assert _root_cause_from_output(child, before) == before


# =============================================================================================
# ssh.sshd_config
# =============================================================================================

def config_lines(text: str) -> set[str]:
    return {line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")}


def test_sshd_config(tmp_path):
    private = str(tmp_path / "private")
    lines = config_lines(ssh.sshd_config(private, 2222, "127.0.0.5", is_root=False))
    for expected in ("Port 2222", "ListenAddress 127.0.0.5", f"HostKey {private}/id_key",
                     f"AuthorizedKeysFile {private}/authorized_keys", "UsePAM no", "PasswordAuthentication no",
                     "StrictModes no", "PermitRootLogin no", "PubkeyAuthentication yes"):
        assert expected in lines, lines
    pid_files = [line.split(None, 1)[1] for line in lines if line.startswith("PidFile ")]
    assert len(pid_files) == 1 and os.path.dirname(pid_files[0]) == private


@pytest.mark.parametrize("listen, is_root, present, absent", [
    pytest.param(None, False, {"PermitRootLogin no", "Port 2200"}, "ListenAddress", id="no-listen"),
    pytest.param("", False, {"PermitRootLogin no"}, "ListenAddress", id="empty-listen"),
    pytest.param("10.0.0.1", True, {"PermitRootLogin prohibit-password", "ListenAddress 10.0.0.1"},
                 "PermitRootLogin no", id="root"),
])
def test_sshd_config_variants(tmp_path, listen, is_root, present, absent):
    text = ssh.sshd_config(str(tmp_path), 2200, listen, is_root=is_root)
    lines = config_lines(text)
    assert present <= lines, lines
    assert not any(line.startswith(absent) for line in lines), lines


# =============================================================================================
# ssh.install_keys
# =============================================================================================

KEY = b"-----BEGIN OPENSSH PRIVATE KEY-----\nfake\n-----END OPENSSH PRIVATE KEY-----\n"
PUB = b"ecdsa-sha2-nistp521 AAAApublic trainer\n"
AUTHORIZED = b"ecdsa-sha2-nistp521 AAAAauthorized trainer\n"


@pytest.fixture
def mount(tmp_path):
    """A Trainer-like read-only Secret mount; made writable again at teardown for cleanup."""
    path = tmp_path / "mount"
    path.mkdir()
    yield path
    path.chmod(0o755)


def fill_mount(path: Path, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        (path / name).write_bytes(data)
        (path / name).chmod(0o640 if name == "id_rsa" else 0o644)
    path.chmod(0o555)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("files, authorized", [
    pytest.param({"id_rsa": KEY, "id_rsa.pub": PUB, "authorized_keys": AUTHORIZED}, AUTHORIZED, id="authorized-keys"),
    pytest.param({"id_rsa": KEY, "id_rsa.pub": PUB}, PUB, id="falls-back-to-public-key"),
    pytest.param({"id_rsa": KEY, "id_rsa.pub": PUB, "authorized_keys": b""}, PUB, id="empty-authorized-keys"),
])
def test_install_keys(tmp_path, mount, files, authorized):
    fill_mount(mount, files)
    private = tmp_path / "private"
    ssh.install_keys(str(mount), str(private))
    assert (private / "id_key").read_bytes() == KEY
    assert mode(private / "id_key") == 0o600
    assert (private / "authorized_keys").read_bytes() == authorized
    assert mode(private / "authorized_keys") == 0o600
    assert mode(private) & 0o077 == 0
    assert sorted(os.listdir(private)) == ["authorized_keys", "id_key"]  # no temporary files left
    assert mode(mount / "id_rsa") == 0o640  # the mount is only read


def test_install_keys_replaces_older_copies(tmp_path, mount):
    fill_mount(mount, {"id_rsa": KEY, "authorized_keys": AUTHORIZED})
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (private / "id_key").write_bytes(b"old")
    (private / "id_key").chmod(0o644)
    ssh.install_keys(str(mount), str(private))
    assert (private / "id_key").read_bytes() == KEY
    assert mode(private / "id_key") == 0o600


@pytest.mark.parametrize("files, missing", [
    pytest.param({"id_rsa.pub": PUB, "authorized_keys": AUTHORIZED}, "id_rsa", id="no-private-key"),
    pytest.param({"id_rsa": KEY}, "id_rsa.pub", id="no-public-or-authorized-keys"),
    pytest.param({}, "id_rsa", id="empty-mount"),
])
def test_install_keys_missing_files(tmp_path, mount, files, missing):
    fill_mount(mount, files)
    with pytest.raises(ConfigError) as raised:
        ssh.install_keys(str(mount), str(tmp_path / "private"))
    message = str(raised.value)
    assert "LAUNCHER_SSH_AUTH_MOUNT_PATH" in message and str(mount) in message and missing in message
    assert raised.value.exit_code == 2


def test_install_keys_missing_mount(tmp_path):
    with pytest.raises(ConfigError, match="LAUNCHER_SSH_AUTH_MOUNT_PATH='/nonexistent/mount'"):
        ssh.install_keys("/nonexistent/mount", str(tmp_path / "private"))


@pytest.mark.skipif(IS_ROOT, reason="root reads any file, so nothing is unreadable")
def test_install_keys_unreadable_key(tmp_path, mount):
    fill_mount(mount, {"id_rsa": KEY, "authorized_keys": AUTHORIZED})
    mount.chmod(0o755)
    (mount / "id_rsa").chmod(0o000)
    mount.chmod(0o555)
    try:
        with pytest.raises(ConfigError) as raised:
            ssh.install_keys(str(mount), str(tmp_path / "private"))
    finally:
        mount.chmod(0o755)
        (mount / "id_rsa").chmod(0o640)
    message = str(raised.value)
    assert "LAUNCHER_SSH_AUTH_MOUNT_PATH" in message and "id_rsa" in message and "readable" in message


def test_plan_leaves_its_inputs_alone(ssh_dir):
    environ = dict(PLAN_ENVIRON)
    args = ["-np", "2", "python3", "x.py"]
    plan_mpi(mpi_settings(), OMPI5, UNIFORM, args, environ, facts())
    assert environ == PLAN_ENVIRON and args == ["-np", "2", "python3", "x.py"]


# The SDK's command: `mpirun --hostfile /etc/mpi/hostfile PROGRAM` (through the image's shim)
@pytest.mark.parametrize("flags, expected", [
    (["--hostfile", "/etc/mpi/hostfile"], ("--hostfile", "/etc/mpi/hostfile")),
    (["--hostfile=/etc/mpi/hostfile"], ("--hostfile", "/etc/mpi/hostfile")),
    (["-np", "4", "-f", "/h1", "--mca", "btl", "tcp", "-machinefile", "/h2"], ("-machinefile", "/h2")),
    (["-np", "4", "--mca", "btl", "tcp"], None),
    (["-x", "--hostfile"], None),  # the value of -x, not an option
])
def test_hostfile_option(flags, expected):
    assert hostfile_option(tuple(flags)) == expected


@pytest.mark.parametrize("impl", IMPLS)
def test_the_users_hostfile_option_gives_way_to_the_translated_copy(ssh_dir, impl):
    plan = make_plan(impl, args=["--hostfile", "/etc/mpi/hostfile", "-x", "FOO", "bash", "-c", "python3 x.py"])
    hostfile = str(ssh_dir / "hostfile")
    assert "/etc/mpi/hostfile" not in plan.argv
    assert sum(word in ("--hostfile", "-f") for word in plan.argv) == 1
    assert hostfile in plan.argv
    assert plan.argv[-3:] == ("bash", "-c", "python3 x.py")
    assert ("-x", "FOO") in pairs(plan.argv)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("program, reports", [(("x.py",), True), (("python3", "x.py"), False)],
                         ids=["launchers-python", "other-python"])
def test_ranks_that_report_their_failures_get_the_report_address_exported(ssh_dir, impl, program, reports):
    plan = make_plan(impl, args=list(program))
    assert plan.rank_reports is reports
    assert ("TRAINER_LAUNCHER_RANK_REPORT" in plan.exported) is reports
    assert "TRAINER_LAUNCHER_RANK_REPORT" not in plan.env_set  # the listener's address comes at run time
    exported = (pairs(plan.argv) if impl.flavor == "openmpi" else
                [("-x", n) for n in plan.argv[plan.argv.index("-genvlist") + 1].split(",")])
    assert (("-x", "TRAINER_LAUNCHER_RANK_REPORT") in exported) is reports


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("watch", [True, False], ids=["hang-timeout", "no-hang-timeout"])
def test_with_hang_detection_the_workers_ranks_get_the_stacks_hook_and_the_board(ssh_dir, impl, watch):
    """The ranks on the workers' pods need the hook on their PYTHONPATH and the board's address,
    both set when the job starts (launcher.status.board); without the knob, nothing is added."""
    environ = {k: v for k, v in PLAN_ENVIRON.items() if k != "PYTHONPATH"}
    plan = plan_mpi(mpi_settings(), impl, UNIFORM, list(PROGRAM), environ, facts(), watch_hangs=watch)
    exported = (pairs(plan.argv) if impl.flavor == "openmpi" else
                [("-x", n) for n in plan.argv[plan.argv.index("-genvlist") + 1].split(",")])
    for name in ("PYTHONPATH", "TRAINER_LAUNCHER_STACKS_BOARD"):
        assert (("-x", name) in exported) is watch
        assert name not in plan.env_set


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("restarts", [True, False], ids=["max-restarts", "no-restarts"])
def test_with_restarts_in_place_the_workers_ranks_get_the_restart_count(ssh_dir, impl, restarts):
    """The ranks on the workers' pods read which start in place they are (LAUNCHER_RESTART_COUNT,
    set at each start): exported past the deny list (LAUNCHER_*) only when the job may restart."""
    plan = plan_mpi(mpi_settings(), impl, UNIFORM, list(PROGRAM), dict(PLAN_ENVIRON), facts(), restarts=restarts)
    exported = (pairs(plan.argv) if impl.flavor == "openmpi" else
                [("-x", n) for n in plan.argv[plan.argv.index("-genvlist") + 1].split(",")])
    assert (("-x", "LAUNCHER_RESTART_COUNT") in exported) is restarts
    assert "LAUNCHER_RESTART_COUNT" not in plan.env_set


# A worker pod lost, as each MPI's launcher pod saw it in tests/test_mpi.py (launcher/mpi/lost.py).
LOST = {
    "ssh": (["Connection to local-node-0-1.local closed by remote host."], "local-node-0-1"),
    "ssh-keepalive": (["Timeout, server 10.0.3.7 not responding."], "10.0.3.7"),
    "open-mpi-4": (["ORTE has lost communication with a remote daemon.", "",
                    "  HNP daemon   : [[52398,0],0] on node local-launcher-0-0",
                    "  Remote daemon: [[52398,0],2] on node local-node-0-1.local"], "local-node-0-1"),
    "open-mpi-5": (["PRTE has lost communication with a remote daemon.", "",
                    "  HNP daemon   : [prterun-local-launcher-0-0-21267@0,0] on node local-launcher-0-0",
                    "  Remote daemon: [prterun-local-launcher-0-0-21267@0,2] on node local-node-0-1"], "local-node-0-1"),
    "mpich": (["[mpiexec@local-launcher-0-0] control_cb (/mpich-5.0.2/src/pm/hydra/mpiexec/pmiserv_cb.c:280): "
               "assert (!closed) failed"], None),
}


@pytest.mark.parametrize("lines, pod", list(LOST.values()), ids=list(LOST))
def test_a_lost_worker_pod_is_peer_lost_naming_the_pod_where_the_output_does(lines, pod):
    from launcher.mpi.lost import LostWorkers

    mpirun = Child(name="mpirun", pid=1, popen=None)
    lost = LostWorkers(mpirun)
    for line in lines:
        lost(Child(name="other", pid=2, popen=None), line)  # another process's words are not mpirun's
    assert lost.outcome("mpirun on tj-launcher-0-0") is None
    for line in lines:
        lost(mpirun, line)
    outcome = lost.outcome("mpirun on tj-launcher-0-0")
    assert (outcome.exit_code, outcome.reason, is_retryable(outcome.exit_code, DEFAULT_RETRYABLE_EXIT_CODES)) == (
        138, "PeerLost", True)
    assert outcome.root_cause.node == pod
    assert (f"lost the worker pod {pod}:" if pod else "does not say which") in outcome.message


@pytest.mark.parametrize("line", [
    "Connection to local-node-0-1.local closed.",  # ssh's word for a session that ended as it should
    "An MPI communication peer process has unexpectedly disconnected.",  # a rank's echo, not a pod's loss
    "[mpiexec@h] HYD_pmci_wait_for_completion (pmiserv_pmci.c:180): error waiting for event",
])
def test_words_that_are_no_pods_loss_leave_mpiruns_verdict(line):
    from launcher.mpi.lost import LostWorkers

    mpirun = Child(name="mpirun", pid=1, popen=None)
    lost = LostWorkers(mpirun)
    lost(mpirun, line)
    assert lost.outcome("mpirun") is None


def test_where_mpiruns_output_names_no_host_the_worker_that_no_longer_answers_is_named():
    """MPICH's mpiexec may exit before ssh says which pod went: the first worker whose sshd port
    refuses now is the lost one (real sockets: one answers, the other's address has no listener)."""
    import socket

    from launcher.mpi.lost import LostWorkers

    mpirun = Child(name="mpirun", pid=1, popen=None)
    lost = LostWorkers(mpirun)
    with socket.create_server(("127.0.0.1", 0)) as serving:
        port = serving.getsockname()[1]
        lost.name_gone(("127.0.0.1", "127.0.0.2"), port)
        assert lost.outcome("mpirun") is None  # nothing was lost: nobody is asked
        lost(mpirun, LOST["mpich"][0][0])
        lost.name_gone(("127.0.0.1", "127.0.0.2"), port)
    outcome = lost.outcome("mpirun on tj-launcher-0-0")
    assert outcome.root_cause.node == "127.0.0.2" and "lost the worker pod 127.0.0.2:" in outcome.message
