"""Malformed XGBoost input, through the real CLI.

Each case runs ``trainer-launcher plan --framework xgboost ...`` in this process, or ``xgboost`` and
``local --framework xgboost`` as a process of their own, with only the case's DMLC_* variables (none
from the caller), and checks what a user reads in the pod log: exit code 2, exactly one line on stderr
naming the variable or flag and repeating the bad value, nothing on stdout, no traceback. The
``xgboost`` and ``local`` cases must also start nothing: their program would leave a file behind.
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
CONTROLLER = ("DMLC_", "LAUNCHER_", "PET_", "JAX_", "JOB_COMPLETION_INDEX")
# What Trainer injects into pod 1 of a 2-node CPU TrainJob named tj.
POD_1 = {"DMLC_TRACKER_URI": "tj-node-0-0.tj", "DMLC_TRACKER_PORT": "29500", "DMLC_TASK_ID": "1", "DMLC_NUM_WORKER": "2"}
PLAN = ("plan", "--framework", "xgboost", "--", "python", "train.py")
TOUCH = ("xgboost", "--", "touch", "{started}")
PYTHON = ("xgboost", "--", sys.executable, "-c", "open('{started}', 'w').close()")


@dataclass(frozen=True)
class Case:
    id: str
    env: dict[str, str]
    names: str
    value: str | None
    args: tuple[str, ...] = PLAN


def env_case(id: str, var: str, value: str, args: tuple[str, ...] = PLAN, **others: str) -> Case:
    return Case(id, {**POD_1, **others, var: value}, var, value, args)


def unset_case(id: str, var: str, **env: str) -> Case:
    return Case(id, {k: v for k, v in {**POD_1, **env}.items() if k != var}, var, None)


CASES = [
    env_case("port-zero", "DMLC_TRACKER_PORT", "0"),
    env_case("port-too-big", "DMLC_TRACKER_PORT", "70000"),
    env_case("port-word", "DMLC_TRACKER_PORT", "http"),
    env_case("port-negative", "DMLC_TRACKER_PORT", "-1"),
    env_case("port-blank", "DMLC_TRACKER_PORT", " "),
    env_case("task-id-negative", "DMLC_TASK_ID", "-1"),
    env_case("task-id-word", "DMLC_TASK_ID", "one"),
    env_case("task-id-fraction", "DMLC_TASK_ID", "1.5"),
    env_case("task-id-equals-worker-count", "DMLC_TASK_ID", "2"),
    Case("completion-index-above-count", {**{k: v for k, v in POD_1.items() if k != "DMLC_TASK_ID"},
                                          "JOB_COMPLETION_INDEX": "7"}, "JOB_COMPLETION_INDEX", "7"),
    env_case("num-worker-zero", "DMLC_NUM_WORKER", "0"),
    env_case("num-worker-negative", "DMLC_NUM_WORKER", "-2"),
    env_case("num-worker-word", "DMLC_NUM_WORKER", "four"),
    env_case("num-worker-with-unit", "DMLC_NUM_WORKER", "2 workers"),
    env_case("num-worker-huge", "DMLC_NUM_WORKER", "100001"),
    env_case("tracker-uri-bad-host", "DMLC_TRACKER_URI", "bad_host!"),
    env_case("tracker-uri-url", "DMLC_TRACKER_URI", "http://tj-node-0-0.tj"),
    env_case("tracker-uri-with-port", "DMLC_TRACKER_URI", "tj-node-0-0.tj:29500"),
    env_case("tracker-uri-bracketed-ipv6", "DMLC_TRACKER_URI", "[fd00::1]"),
    env_case("tracker-uri-blank", "DMLC_TRACKER_URI", " "),
    unset_case("tracker-uri-unset-for-two-workers", "DMLC_TRACKER_URI"),
    # G = 2 workers per pod (GPUs stand-in): the worker count must split into pods of 2.
    env_case("num-worker-not-a-multiple-of-gpus", "DMLC_NUM_WORKER", "3",
             LAUNCHER_XGBOOST_WORKERS_PER_POD="2"),
    env_case("pod-index-beyond-the-pods-gpus-make", "DMLC_TASK_ID", "1", LAUNCHER_XGBOOST_WORKERS_PER_POD="2"),
    env_case("tracker-knob-maybe", "LAUNCHER_XGBOOST_TRACKER", "maybe"),
    Case("tracker-flag-maybe", POD_1, "--xgboost-tracker", "maybe",
         ("plan", "--framework", "xgboost", "--xgboost-tracker", "maybe", "--", "python", "train.py")),
    env_case("workers-per-pod-zero", "LAUNCHER_XGBOOST_WORKERS_PER_POD", "0"),
    Case("workers-per-pod-flag-word", POD_1, "--xgboost-workers-per-pod", "many",
         ("plan", "--framework", "xgboost", "--xgboost-workers-per-pod", "many", "--", "python", "train.py")),
    env_case("rendezvous-timeout-word", "LAUNCHER_RENDEZVOUS_TIMEOUT", "soon"),
    env_case("run-port-word", "DMLC_TRACKER_PORT", "http", TOUCH),
    env_case("run-task-id-equals-count", "DMLC_TASK_ID", "2", TOUCH),
    env_case("run-python-num-worker-zero", "DMLC_NUM_WORKER", "0", PYTHON),
    env_case("run-python-not-a-multiple", "DMLC_NUM_WORKER", "5", PYTHON, LAUNCHER_XGBOOST_WORKERS_PER_POD="2"),
    Case("run-without-program", POD_1, "PROGRAM", None, ("xgboost",)),
    Case("local-nnodes-zero", {}, "--nnodes", "0",
         ("local", "--framework", "xgboost", "--nnodes", "0", "--", "touch", "{started}")),
    Case("local-nproc-per-node-zero", {}, "--nproc-per-node", "0",
         ("local", "--framework", "xgboost", "--nnodes", "2", "--nproc-per-node", "0", "--", "touch", "{started}")),
    Case("local-nproc-per-node-word", {}, "--nproc-per-node", "gpu",
         ("local", "--framework", "xgboost", "--nnodes", "2", "--nproc-per-node", "gpu", "--", "touch", "{started}")),
    Case("local-without-program", {}, "PROGRAM", None, ("local", "--framework", "xgboost", "--nnodes", "2")),
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
    if case.value is None:
        assert "unset" in line, line
    assert not started.exists(), "nothing may start on bad input"


@pytest.mark.unit
@pytest.mark.parametrize("case", IN_PROCESS, ids=[case.id for case in IN_PROCESS])
def test_bad_xgboost_input_exits_2_with_one_line_naming_it(case: Case, tmp_path: Path, cli):
    started = tmp_path / "started"
    check_refused(case, cli([a.replace("{started}", str(started)) for a in case.args], case.env), started)


@pytest.mark.parametrize("case", AS_PROCESS, ids=[case.id for case in AS_PROCESS])
def test_bad_xgboost_input_to_a_command_that_starts_processes_first_exits_2_with_one_line_naming_it(case: Case, tmp_path: Path):
    started = tmp_path / "started"
    check_refused(case, launcher(case.args, case.env, started), started)


def test_the_line_says_what_was_expected(tmp_path: Path):
    said = launcher(PLAN, {**POD_1, "DMLC_TASK_ID": "2"}, tmp_path / "x").stderr
    assert "a pod index from 0 to 1 (DMLC_NUM_WORKER=2)" in said
    said = launcher(PLAN, {**POD_1, "DMLC_NUM_WORKER": "3", "LAUNCHER_XGBOOST_WORKERS_PER_POD": "2"}, tmp_path / "x").stderr
    assert "a multiple of the 2 workers this pod runs" in said
    said = launcher(PLAN, {**POD_1, "DMLC_TRACKER_URI": "tj-node-0-0.tj:29500"}, tmp_path / "x").stderr
    assert "without a port" in said


def test_the_runner_alone_refuses_a_bad_variable_in_one_line_too(tmp_path: Path):
    """launcher/xgboost/run.py run by hand (no launcher validated the variables)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(CONTROLLER)}
    env.update(POD_1, DMLC_TASK_ID="x")
    result = subprocess.run([sys.executable, str(REPO / "launcher" / "xgboost" / "run.py"), "-c", "pass"],
                            env=env, capture_output=True, text=True, timeout=60)
    assert_one_line_naming(result, "DMLC_TASK_ID", "x")


def test_there_are_at_least_15_cases_with_unique_ids():
    assert len(CASES) >= 15
    assert len({case.id for case in CASES}) == len(CASES)
