"""Malformed MPI input, through the real CLI.

Each case runs ``trainer-launcher plan --framework mpi ...`` in the test's own process (the ``cli``
fixture: a few hundred milliseconds of interpreter start saved per case), or, where the command
starts processes (``mpi``, ``mpi --worker``, a plan that asks mpirun what it is), as a real
subprocess; either in a clean environment (no LAUNCHER_*, OMPI_*, PRTE_*, I_MPI_* or HYDRA_* from
the caller) with its own hostfiles in ``tmp_path``. Each checks what a user sees in the pod log:
exit code 2, exactly one line on stderr naming the variable, flag or ``file:line`` and repeating
the bad value, nothing on stdout, no traceback. ``--mpirun /bin/true --implementation mpich``
keeps the cases independent of any MPI installed here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import assert_one_line_naming

REPO = Path(__file__).resolve().parents[1]
MPI_PREFIXES = ("LAUNCHER_", "OMPI_", "PRTE_", "I_MPI_", "HYDRA_", "PET_")
TMP = "{tmp}"  # replaced by the test's tmp_path in args and env values
MPICH = ("--mpirun", "/bin/true", "--implementation", "mpich")
GOOD = "tj-node-0-0.tj slots=2\ntj-node-0-1.tj slots=2\n"

# Hostfiles every case can refer to as {tmp}/NAME.
HOSTFILES: dict[str, str | bytes] = {
    "good": GOOD,
    "empty": "",
    "comments": "# the Trainer's hostfile\n\n   # nothing else\n",
    "duplicate": "tj-node-0-0.tj slots=2\nTJ-NODE-0-0.TJ slots=2\n",
    "slots-zero": "tj-node-0-0.tj slots=0\n",
    "slots-word": "tj-node-0-0.tj slots=2\ntj-node-0-1.tj slots=abc\n",
    "slots-huge": "tj-node-0-0.tj slots=99999\n",
    "hydra-zero": "# hosts\ntj-node-0-0.tj:2\ntj-node-0-1.tj:0\n",
    "hydra-extra-field": "tj-node-0-0.tj: 2\n",
    "bad-host": "bad_host! slots=1\n",
    "unknown-option": "tj-node-0-0.tj slots=2 foo=bar\n",
    "superscript": "tj-node-0-0.tj:\u00b2\n",
    "not-utf8": b"tj-node-0-0.tj slots=2\n\xff\xfe slots=1\n",
}


@dataclass(frozen=True)
class Case:
    id: str
    args: tuple[str, ...]
    names: str  # what the line must name: a variable, a flag or FILE:LINE ({tmp} allowed)
    value: str | None = None  # the bad value the line must repeat ({tmp} allowed)
    env: dict[str, str] = field(default_factory=dict)
    unset: bool = False  # the line must say the thing is unset


def plan(*args: str) -> tuple[str, ...]:
    return ("plan", "--framework", "mpi", *MPICH, *args, "--", "python3", "train.py")


def hostfile_case(id: str, name: str, line: int | None, value: str | None) -> Case:
    where = f"{TMP}/{name}" + (f":{line}" if line else "")
    return Case(id, plan("--hostfile", f"{TMP}/{name}"), where, value)


def plan_env(id: str, var: str, value: str, *args: str) -> Case:
    return Case(id, plan("--hostfile", f"{TMP}/good", *args), var, value, {var: value})


def plan_flag(id: str, flag: str, value: str) -> Case:
    return Case(id, plan("--hostfile", f"{TMP}/good", flag, value), flag, value)


CASES = [
    # --- where the hostfile comes from --------------------------------------------------------
    Case("hostfile-flag-missing", plan("--hostfile", f"{TMP}/nope"), "--hostfile", f"{TMP}/nope"),
    *(Case(f"hostfile-env-missing-{var}", plan(), var, f"{TMP}/nope", {var: f"{TMP}/nope"})
      for var in ("LAUNCHER_MPI_HOSTFILE", "OMPI_MCA_orte_default_hostfile", "PRTE_MCA_prte_default_hostfile",
                  "I_MPI_HYDRA_HOST_FILE", "HYDRA_HOST_FILE")),
    Case("hostfile-is-a-directory", plan("--hostfile", TMP), "--hostfile", TMP),
    # the SDK's `mpirun --hostfile FILE ...`: mpirun's own option names the file
    Case("mpirun-hostfile-missing", ("plan", "--framework", "mpi", *MPICH, "--", "--hostfile", f"{TMP}/nope",
                                     "python3", "train.py"), "mpirun --hostfile", f"{TMP}/nope"),
    # --- what is in it -----------------------------------------------------------------------------
    hostfile_case("hostfile-empty", "empty", None, None),
    hostfile_case("hostfile-only-comments", "comments", None, None),
    hostfile_case("hostfile-duplicate-host", "duplicate", 2, "TJ-NODE-0-0.TJ slots=2"),
    hostfile_case("hostfile-slots-zero", "slots-zero", 1, "tj-node-0-0.tj slots=0"),
    hostfile_case("hostfile-slots-word", "slots-word", 2, "tj-node-0-1.tj slots=abc"),
    hostfile_case("hostfile-slots-huge", "slots-huge", 1, "tj-node-0-0.tj slots=99999"),
    hostfile_case("hostfile-hydra-zero", "hydra-zero", 3, "tj-node-0-1.tj:0"),
    hostfile_case("hostfile-hydra-extra-field", "hydra-extra-field", 1, "tj-node-0-0.tj: 2"),
    hostfile_case("hostfile-bad-host-name", "bad-host", 1, "bad_host! slots=1"),
    hostfile_case("hostfile-unknown-option", "unknown-option", 1, "foo=bar"),
    hostfile_case("hostfile-superscript-slots", "superscript", 1, "tj-node-0-0.tj:\u00b2"),
    hostfile_case("hostfile-not-utf8", "not-utf8", None, None),
    Case("hostfile-bad-via-env-var", plan(), f"{TMP}/slots-zero:1", "tj-node-0-0.tj slots=0",
         {"OMPI_MCA_orte_default_hostfile": f"{TMP}/slots-zero"}),
    # --- MPI knobs ---------------------------------------------------------------------------------
    plan_flag("ssh-port-zero", "--ssh-port", "0"),
    plan_flag("ssh-port-70000", "--ssh-port", "70000"),
    plan_flag("ssh-port-word", "--ssh-port", "abc"),
    plan_env("ssh-port-env-negative", "LAUNCHER_SSH_PORT", "-1"),
    plan_flag("default-slots-zero", "--default-slots", "0"),
    plan_flag("default-slots-word", "--default-slots", "x"),
    plan_env("default-slots-ompi-env", "OMPI_MCA_orte_set_default_slots", "abc"),
    plan_env("default-slots-prte-env", "PRTE_MCA_prte_set_default_slots", "0"),
    Case("implementation-lam", ("plan", "--framework", "mpi", "--mpirun", "/bin/true", "--implementation", "lam",
                                "--hostfile", f"{TMP}/good", "--", "prog"), "--implementation", "lam"),
    Case("implementation-env-lam", ("plan", "--framework", "mpi", "--mpirun", "/bin/true",
                                    "--hostfile", f"{TMP}/good", "--", "prog"),
         "LAUNCHER_MPI_IMPLEMENTATION", "lam", {"LAUNCHER_MPI_IMPLEMENTATION": "lam"}),
    Case("implementation-auto-unrecognised", ("plan", "--framework", "mpi", "--mpirun", "/bin/true",
                                              "--hostfile", f"{TMP}/good", "--", "prog"),
         "LAUNCHER_MPI_IMPLEMENTATION", "auto"),
    plan_flag("export-space", "--export", "a b"),
    plan_flag("export-deny-semicolon", "--export-deny", "A;B"),
    plan_env("export-env-only-commas", "LAUNCHER_MPI_EXPORT", ",,"),
    plan_flag("abort-on-exception-maybe", "--abort-on-exception", "maybe"),
    plan_flag("ssh-listen-address-bad", "--ssh-listen-address", "bad host!"),
    plan_flag("ssh-host-key-checking-no", "--ssh-host-key-checking", "no"),
    plan_env("ssh-host-key-checking-env-strict", "LAUNCHER_SSH_HOST_KEY_CHECKING", "strict"),
    # --- finding mpirun ------------------------------------------------------------------------------
    Case("mpirun-flag-nonexistent", ("plan", "--framework", "mpi", "--mpirun", "/nonexistent/mpirun",
                                     "--hostfile", f"{TMP}/good", "--", "prog"), "--mpirun", "/nonexistent/mpirun"),
    Case("mpirun-env-nonexistent", ("plan", "--framework", "mpi", "--hostfile", f"{TMP}/good", "--", "prog"),
         "LAUNCHER_MPIRUN", "/nonexistent/mpirun", {"LAUNCHER_MPIRUN": "/nonexistent/mpirun"}),
    Case("mpirun-none-on-path", ("plan", "--framework", "mpi", "--implementation", "mpich",
                                 "--hostfile", f"{TMP}/good", "--", "prog"),
         "LAUNCHER_MPIRUN", None, {"PATH": f"{TMP}/emptybin"}, unset=True),
    # --- the mpi roles ---------------------------------------------------------------------------------
    Case("mpi-launcher-bad-hostfile", ("mpi", *MPICH, "--hostfile", f"{TMP}/slots-zero", "--ssh-dir", f"{TMP}/s",
                                       "--", "python3", "train.py"), f"{TMP}/slots-zero:1", "tj-node-0-0.tj slots=0"),
    Case("mpi-launcher-no-program", ("mpi", *MPICH, "--hostfile", f"{TMP}/good", "--ssh-dir", f"{TMP}/s"),
         "PROGRAM", None, unset=True),
    Case("mpi-worker-mount-flag-missing", ("mpi", "--worker", "--ssh-auth-mount-path", "/nonexistent",
                                           "--ssh-dir", f"{TMP}/s"), "--ssh-auth-mount-path", "/nonexistent"),
    Case("mpi-worker-mount-env-missing", ("mpi", "--worker", "--ssh-dir", f"{TMP}/s"),
         "LAUNCHER_SSH_AUTH_MOUNT_PATH", "/nonexistent", {"LAUNCHER_SSH_AUTH_MOUNT_PATH": "/nonexistent"}),
    Case("mpi-worker-mount-without-key", ("mpi", "--worker", "--ssh-dir", f"{TMP}/s"),
         "LAUNCHER_SSH_AUTH_MOUNT_PATH", f"{TMP}/emptybin", {"LAUNCHER_SSH_AUTH_MOUNT_PATH": f"{TMP}/emptybin"}),
    Case("mpi-worker-bad-ssh-port", ("mpi", "--worker", "--ssh-port", "0", "--ssh-dir", f"{TMP}/s"),
         "--ssh-port", "0"),
]


def clean_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(MPI_PREFIXES) and k != "JOB_COMPLETION_INDEX"}
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


def fill(text: str, tmp_path: Path) -> str:
    return text.replace(TMP, str(tmp_path))


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    for name, content in HOSTFILES.items():
        if isinstance(content, bytes):
            (tmp_path / name).write_bytes(content)
        else:
            (tmp_path / name).write_text(content)
    (tmp_path / "emptybin").mkdir()
    return tmp_path


def launcher(args, env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "launcher", *(fill(a, tmp_path) for a in args)],
        cwd=REPO, env=clean_env({k: fill(v, tmp_path) for k, v in env.items()}),
        capture_output=True, text=True, timeout=120,
    )


def _in_process(case: Case) -> bool:
    """``plan`` with ``MPICH`` (mpirun /bin/true, named mpich) starts nothing; ``mpi`` starts sshd or
    mpirun once its input is good, and without MPICH the plan asks mpirun what it is."""
    return case.args[0] == "plan" and all(arg in case.args for arg in MPICH)


PLANS = [case for case in CASES if _in_process(case)]
STARTS = [case for case in CASES if not _in_process(case)]


@pytest.mark.unit
@pytest.mark.parametrize("case", PLANS, ids=[case.id for case in PLANS])
def test_bad_mpi_input_exits_2_with_one_line_naming_it(case: Case, workdir: Path, cli):
    result = cli([fill(arg, workdir) for arg in case.args], {k: fill(v, workdir) for k, v in case.env.items()})
    _says_it_in_one_line(case, result, workdir)


@pytest.mark.parametrize("case", STARTS, ids=[case.id for case in STARTS])
def test_bad_mpi_input_to_a_command_that_starts_processes_exits_2_with_one_line_naming_it(case: Case, workdir: Path):
    _says_it_in_one_line(case, launcher(case.args, case.env, workdir), workdir)


def _says_it_in_one_line(case: Case, result: subprocess.CompletedProcess, workdir: Path) -> None:
    value = fill(case.value, workdir) if case.value is not None else None
    line = assert_one_line_naming(result, fill(case.names, workdir), value)
    if case.unset:
        assert "unset" in line, line
    assert not (workdir / "s").exists() or case.args[0] == "mpi", "plan must not write anything"


def test_there_are_at_least_20_cases():
    assert len(CASES) >= 20
    assert len({case.id for case in CASES}) == len(CASES), "case ids must be unique"


# --- what a good hostfile source gives -----------------------------------------------------------

OTHER = "tj-other-0-0.tj slots=3\ntj-other-0-1.tj slots=3\n"


def plan_json(args, env, tmp_path) -> dict:
    result = launcher(("plan", "--framework", "mpi", *MPICH, "--ssh-dir", f"{TMP}/s", *args, "--", "python3", "t.py"),
                      env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("var", ["LAUNCHER_MPI_HOSTFILE", "OMPI_MCA_orte_default_hostfile",
                                 "PRTE_MCA_prte_default_hostfile", "I_MPI_HYDRA_HOST_FILE", "HYDRA_HOST_FILE"])
def test_hostfile_from_env_var(workdir: Path, var: str):
    (workdir / "other").write_text(OTHER)
    data = plan_json((), {var: f"{TMP}/other"}, workdir)
    assert data["hosts"] == [{"name": "tj-other-0-0.tj", "slots": 3}, {"name": "tj-other-0-1.tj", "slots": 3}]
    assert data["ranks"] == 6
    assert data["sources"]["hostfile"] == var
    assert data["hostfile"]["text"] == "tj-other-0-0.tj:3\ntj-other-0-1.tj:3\n"
    assert data["hostfile"]["path"] == str(workdir / "s" / "hostfile")


@pytest.mark.parametrize("env", [
    pytest.param({"OMPI_MCA_orte_default_hostfile": f"{TMP}/other"}, id="over-good-env"),
    pytest.param({"OMPI_MCA_orte_default_hostfile": f"{TMP}/nope", "HYDRA_HOST_FILE": f"{TMP}/empty"}, id="over-bad-env"),
])
def test_hostfile_flag_wins_over_env_vars(workdir: Path, env):
    (workdir / "other").write_text(OTHER)
    data = plan_json(("--hostfile", f"{TMP}/good"), env, workdir)
    assert [h["name"] for h in data["hosts"]] == ["tj-node-0-0.tj", "tj-node-0-1.tj"]
    assert data["sources"]["hostfile"] == "--hostfile"


def test_launcher_variable_wins_over_trainer_variables(workdir: Path):
    (workdir / "other").write_text(OTHER)
    data = plan_json((), {"LAUNCHER_MPI_HOSTFILE": f"{TMP}/good", "OMPI_MCA_orte_default_hostfile": f"{TMP}/other",
                          "PRTE_MCA_prte_default_hostfile": f"{TMP}/nope"}, workdir)
    assert [h["name"] for h in data["hosts"]] == ["tj-node-0-0.tj", "tj-node-0-1.tj"]
    assert data["sources"]["hostfile"] == "LAUNCHER_MPI_HOSTFILE"


def test_trainer_default_slots_apply_to_lines_without_a_count(workdir: Path):
    (workdir / "bare").write_text("tj-node-0-0.tj\ntj-node-0-1.tj slots=1\n")
    data = plan_json(("--hostfile", f"{TMP}/bare"), {"OMPI_MCA_orte_set_default_slots": "4"}, workdir)
    assert data["hosts"] == [{"name": "tj-node-0-0.tj", "slots": 4}, {"name": "tj-node-0-1.tj", "slots": 1}]
    assert data["ranks"] == 5


def test_ssh_port_flag_reaches_the_plan(workdir: Path):
    data = plan_json(("--hostfile", f"{TMP}/good", "--ssh-port", "2022"), {"LAUNCHER_SSH_PORT": "abc"}, workdir)
    assert data["ssh"]["port"] == data["wait"]["port"] == 2022
    assert "Port 2022" in data["ssh"]["configText"]
