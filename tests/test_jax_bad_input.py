"""Malformed JAX input, through the real CLI.

Each case runs ``trainer-launcher plan --framework jax ...`` in this process, or ``jax`` and ``local
--framework jax`` as a process of their own, with only the case's JAX_* variables (none from the
caller), and checks
what a user sees in the pod log: exit code 2, exactly one line on stderr naming the variable or
flag and repeating the bad value, nothing on stdout, no traceback. ``jax`` cases must also start
nothing: the program they name would leave a file behind.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import assert_one_line_naming

REPO = Path(__file__).resolve().parents[1]
CONTROLLER = ("JAX_", "LAUNCHER_", "PET_", "JOB_COMPLETION_INDEX")
TWO = {"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1", "JAX_COORDINATOR_ADDRESS": "tj-node-0-0.tj:29500"}


@dataclass(frozen=True)
class Case:
    id: str
    env: dict[str, str]
    names: str
    value: str | None
    args: tuple[str, ...] = ("plan", "--framework", "jax", "--", "python", "train.py")
    unset: bool = False


def env_case(id: str, var: str, value: str, **others: str) -> Case:
    return Case(id, {**TWO, **others, var: value}, var, value)


def run_case(id: str, var: str, value: str) -> Case:
    """The same through ``trainer-launcher jax``, which would start the program."""
    return Case(id, {**TWO, var: value}, var, value, ("jax", "--", "touch", "{started}"))


def python_case(id: str, var: str, value: str) -> Case:
    """A Python program, whose runner the launcher starts before it validates anything: it must
    leave without a word and without running the program."""
    program = ("jax", "--", sys.executable, "-c", "open('{started}', 'w').close()")
    return Case(id, {**TWO, var: value}, var, value, program)


CASES = [
    env_case("num-processes-zero", "JAX_NUM_PROCESSES", "0"),
    env_case("num-processes-negative", "JAX_NUM_PROCESSES", "-1"),
    env_case("num-processes-word", "JAX_NUM_PROCESSES", "two"),
    env_case("num-processes-fraction", "JAX_NUM_PROCESSES", "2.5"),
    env_case("num-processes-with-unit", "JAX_NUM_PROCESSES", "3 nodes"),
    env_case("num-processes-huge", "JAX_NUM_PROCESSES", "100001"),
    env_case("process-id-negative", "JAX_PROCESS_ID", "-1"),
    env_case("process-id-word", "JAX_PROCESS_ID", "abc"),
    env_case("process-id-equals-count", "JAX_PROCESS_ID", "2"),
    env_case("process-id-above-count", "JAX_PROCESS_ID", "5", JAX_NUM_PROCESSES="3"),
    Case("completion-index-above-count", {"JAX_NUM_PROCESSES": "2", "JOB_COMPLETION_INDEX": "3",
                                          "JAX_COORDINATOR_ADDRESS": "tj-node-0-0.tj:29500"},
         "JOB_COMPLETION_INDEX", "3"),
    env_case("coordinator-without-port", "JAX_COORDINATOR_ADDRESS", "tj-node-0-0.tj"),
    env_case("coordinator-port-zero", "JAX_COORDINATOR_ADDRESS", "tj-node-0-0.tj:0"),
    env_case("coordinator-port-too-big", "JAX_COORDINATOR_ADDRESS", "tj-node-0-0.tj:70000"),
    env_case("coordinator-port-word", "JAX_COORDINATOR_ADDRESS", "tj-node-0-0.tj:http"),
    env_case("coordinator-bad-host", "JAX_COORDINATOR_ADDRESS", "bad_host!:29500"),
    env_case("coordinator-url", "JAX_COORDINATOR_ADDRESS", "http://tj-node-0-0.tj:29500"),
    env_case("coordinator-unbracketed-ipv6", "JAX_COORDINATOR_ADDRESS", "fd00::1:29500"),
    env_case("coordinator-blank", "JAX_COORDINATOR_ADDRESS", " "),
    Case("coordinator-unset-for-two", {"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "0"},
         "JAX_COORDINATOR_ADDRESS", None, unset=True),
    env_case("initialize-env-maybe", "LAUNCHER_JAX_INITIALIZE", "maybe"),
    Case("initialize-flag-maybe", TWO, "--jax-initialize", "maybe",
         ("plan", "--framework", "jax", "--jax-initialize", "maybe", "--", "python", "train.py")),
    env_case("rendezvous-timeout-word", "LAUNCHER_RENDEZVOUS_TIMEOUT", "soon"),
    run_case("run-process-id-equals-count", "JAX_PROCESS_ID", "2"),
    run_case("run-coordinator-without-port", "JAX_COORDINATOR_ADDRESS", "tj-node-0-0.tj"),
    run_case("run-num-processes-zero", "JAX_NUM_PROCESSES", "0"),
    Case("run-without-program", TWO, "PROGRAM", None, ("jax",), unset=True),
    python_case("python-run-process-id-word", "JAX_PROCESS_ID", "one"),
    python_case("python-run-coordinator-port-word", "JAX_COORDINATOR_ADDRESS", "tj-node-0-0.tj:http"),
    python_case("python-run-initialize-maybe", "LAUNCHER_JAX_INITIALIZE", "maybe"),
    Case("local-nproc-per-node-two", {}, "--nproc-per-node", "2",
         ("local", "--framework", "jax", "--nnodes", "2", "--nproc-per-node", "2", "--", "touch", "{started}")),
    Case("local-nnodes-zero", {}, "--nnodes", "0",
         ("local", "--framework", "jax", "--nnodes", "0", "--", "touch", "{started}")),
    Case("local-without-program", {}, "PROGRAM", None, ("local", "--framework", "jax", "--nnodes", "2"), unset=True),
]


def launcher(args: tuple[str, ...], extra: dict[str, str], started: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(CONTROLLER)}
    env.update(extra, PYTHONPATH=str(REPO))
    argv = [sys.executable, "-m", "launcher", *(a.replace("{started}", str(started)) for a in args)]
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


# ``plan`` starts nothing: its cases run the CLI in this process (tests/cli_fixture.py); the
# subcommands that start the framework's runner or the nodes before they validate, as a process.
IN_PROCESS = [case for case in CASES if case.args[0] == "plan"]
AS_PROCESS = [case for case in CASES if case.args[0] != "plan"]


def check_refused(case: Case, result: subprocess.CompletedProcess, started: Path) -> None:
    line = assert_one_line_naming(result, case.names, case.value)
    if case.unset:
        assert "unset" in line, line
    assert not started.exists(), "nothing may start on bad input"


@pytest.mark.unit
@pytest.mark.parametrize("case", IN_PROCESS, ids=[case.id for case in IN_PROCESS])
def test_bad_jax_input_exits_2_with_one_line_naming_it(case: Case, tmp_path: Path, cli):
    started = tmp_path / "started"
    check_refused(case, cli([a.replace("{started}", str(started)) for a in case.args], case.env), started)


@pytest.mark.parametrize("case", AS_PROCESS, ids=[case.id for case in AS_PROCESS])
def test_bad_jax_input_to_a_command_that_starts_processes_first_exits_2_with_one_line_naming_it(case: Case, tmp_path: Path):
    started = tmp_path / "started"
    check_refused(case, launcher(case.args, case.env, started), started)


def test_the_line_says_what_was_expected():
    result = launcher(CASES[0].args, {**TWO, "JAX_PROCESS_ID": "2"}, Path("/nonexistent"))
    assert "from 0 to 1 (JAX_NUM_PROCESSES=2)" in result.stderr
    result = launcher(CASES[0].args, {**TWO, "JAX_COORDINATOR_ADDRESS": "tj-node-0-0.tj"}, Path("/nonexistent"))
    assert "HOST:PORT" in result.stderr and "port from 1 to 65535" in result.stderr


def test_there_are_at_least_15_cases_with_unique_ids():
    assert len(CASES) >= 15
    assert len({case.id for case in CASES}) == len(CASES)
