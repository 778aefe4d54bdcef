"""Malformed JAX and XGBoost input, through the real CLI: one harness, each framework's own table.

Each case runs ``trainer-launcher plan --framework <framework> ...`` in this process, or
``<framework>`` and ``local --framework <framework>`` as a process of their own, with only the
case's variables (none from the caller), and checks what a user reads in the pod log: exit code 2,
exactly one line on stderr naming the variable or flag and repeating the bad value (saying "unset"
where there is none), nothing on stdout, no traceback. Cases that start a command must also start
nothing: the program they name would leave a file behind. Test ids name the framework:
``[jax-...]``, ``[xgboost-...]``.
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
CONTROLLER = ("DMLC_", "JAX_", "LAUNCHER_", "PET_", "JOB_COMPLETION_INDEX")


@dataclass(frozen=True)
class Case:
    id: str
    env: dict[str, str]
    names: str
    value: str | None  # None: the variable or argument is unset, and the line says so
    args: tuple[str, ...]


def plan(framework: str, *flags: str) -> tuple[str, ...]:
    return ("plan", "--framework", framework, *flags, "--", "python", "train.py")


def touch(framework: str) -> tuple[str, ...]:
    """The framework's command, which would start the program."""
    return (framework, "--", "touch", "{started}")


def python(framework: str) -> tuple[str, ...]:
    """A Python program, whose runner the launcher starts before it validates anything: it must
    leave without a word and without running the program."""
    return (framework, "--", sys.executable, "-c", "open('{started}', 'w').close()")


def local(framework: str, *flags: str) -> tuple[str, ...]:
    return ("local", "--framework", framework, *flags, "--", "touch", "{started}")


@dataclass(frozen=True)
class Framework:
    name: str
    pod: dict[str, str]  # what Trainer injects into pod 1 of a 2-node TrainJob named tj
    cases: tuple[Case, ...]
    explained: tuple[tuple[dict[str, str], tuple[str, ...]], ...]  # a bad value, what its line says is expected
    by_hand: tuple[str, str]  # a variable and a bad value for the runner run by hand


def env_cases(framework: str, pod: dict[str, str]):
    """Cases of the pod's variables with one bad value (and any others), planned unless ``args``
    name another command."""

    def case(id: str, var: str, value: str, args: tuple[str, ...] | None = None, **others: str) -> Case:
        return Case(id, {**pod, **others, var: value}, var, value, args or plan(framework))

    return case


# --- JAX's table -----------------------------------------------------------------------------------

JAX_POD = {"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1", "JAX_COORDINATOR_ADDRESS": "tj-node-0-0.tj:29500"}
jax = env_cases("jax", JAX_POD)
JAX = Framework("jax", JAX_POD, (
    jax("num-processes-zero", "JAX_NUM_PROCESSES", "0"),
    jax("num-processes-negative", "JAX_NUM_PROCESSES", "-1"),
    jax("num-processes-word", "JAX_NUM_PROCESSES", "two"),
    jax("num-processes-fraction", "JAX_NUM_PROCESSES", "2.5"),
    jax("num-processes-with-unit", "JAX_NUM_PROCESSES", "3 nodes"),
    jax("num-processes-huge", "JAX_NUM_PROCESSES", "100001"),
    jax("process-id-negative", "JAX_PROCESS_ID", "-1"),
    jax("process-id-word", "JAX_PROCESS_ID", "abc"),
    jax("process-id-equals-count", "JAX_PROCESS_ID", "2"),
    jax("process-id-above-count", "JAX_PROCESS_ID", "5", JAX_NUM_PROCESSES="3"),
    Case("completion-index-above-count", {"JAX_NUM_PROCESSES": "2", "JOB_COMPLETION_INDEX": "3",
                                          "JAX_COORDINATOR_ADDRESS": "tj-node-0-0.tj:29500"},
         "JOB_COMPLETION_INDEX", "3", plan("jax")),
    jax("coordinator-without-port", "JAX_COORDINATOR_ADDRESS", "tj-node-0-0.tj"),
    jax("coordinator-port-zero", "JAX_COORDINATOR_ADDRESS", "tj-node-0-0.tj:0"),
    jax("coordinator-port-too-big", "JAX_COORDINATOR_ADDRESS", "tj-node-0-0.tj:70000"),
    jax("coordinator-port-word", "JAX_COORDINATOR_ADDRESS", "tj-node-0-0.tj:http"),
    jax("coordinator-bad-host", "JAX_COORDINATOR_ADDRESS", "bad_host!:29500"),
    jax("coordinator-url", "JAX_COORDINATOR_ADDRESS", "http://tj-node-0-0.tj:29500"),
    jax("coordinator-unbracketed-ipv6", "JAX_COORDINATOR_ADDRESS", "fd00::1:29500"),
    jax("coordinator-blank", "JAX_COORDINATOR_ADDRESS", " "),
    Case("coordinator-unset-for-two", {"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "0"},
         "JAX_COORDINATOR_ADDRESS", None, plan("jax")),
    jax("initialize-env-maybe", "LAUNCHER_JAX_INITIALIZE", "maybe"),
    Case("initialize-flag-maybe", JAX_POD, "--jax-initialize", "maybe", plan("jax", "--jax-initialize", "maybe")),
    jax("rendezvous-timeout-word", "LAUNCHER_RENDEZVOUS_TIMEOUT", "soon"),
    jax("run-process-id-equals-count", "JAX_PROCESS_ID", "2", touch("jax")),
    jax("run-coordinator-without-port", "JAX_COORDINATOR_ADDRESS", "tj-node-0-0.tj", touch("jax")),
    jax("run-num-processes-zero", "JAX_NUM_PROCESSES", "0", touch("jax")),
    Case("run-without-program", JAX_POD, "PROGRAM", None, ("jax",)),
    jax("python-run-process-id-word", "JAX_PROCESS_ID", "one", python("jax")),
    jax("python-run-coordinator-port-word", "JAX_COORDINATOR_ADDRESS", "tj-node-0-0.tj:http", python("jax")),
    jax("python-run-initialize-maybe", "LAUNCHER_JAX_INITIALIZE", "maybe", python("jax")),
    Case("local-nproc-per-node-two", {}, "--nproc-per-node", "2",
         local("jax", "--nnodes", "2", "--nproc-per-node", "2")),
    Case("local-nnodes-zero", {}, "--nnodes", "0", local("jax", "--nnodes", "0")),
    Case("local-without-program", {}, "PROGRAM", None, ("local", "--framework", "jax", "--nnodes", "2")),
), (
    ({"JAX_PROCESS_ID": "2"}, ("from 0 to 1 (JAX_NUM_PROCESSES=2)",)),
    ({"JAX_COORDINATOR_ADDRESS": "tj-node-0-0.tj"}, ("HOST:PORT", "port from 1 to 65535")),
), ("JAX_PROCESS_ID", "x"))


# --- XGBoost's table -------------------------------------------------------------------------------

XGBOOST_POD = {"DMLC_TRACKER_URI": "tj-node-0-0.tj", "DMLC_TRACKER_PORT": "29500", "DMLC_TASK_ID": "1",
               "DMLC_NUM_WORKER": "2"}
xgb = env_cases("xgboost", XGBOOST_POD)


def xgb_unset(id: str, var: str) -> Case:
    return Case(id, {k: v for k, v in XGBOOST_POD.items() if k != var}, var, None, plan("xgboost"))


XGBOOST = Framework("xgboost", XGBOOST_POD, (
    xgb("port-zero", "DMLC_TRACKER_PORT", "0"),
    xgb("port-too-big", "DMLC_TRACKER_PORT", "70000"),
    xgb("port-word", "DMLC_TRACKER_PORT", "http"),
    xgb("port-negative", "DMLC_TRACKER_PORT", "-1"),
    xgb("port-blank", "DMLC_TRACKER_PORT", " "),
    xgb("task-id-negative", "DMLC_TASK_ID", "-1"),
    xgb("task-id-word", "DMLC_TASK_ID", "one"),
    xgb("task-id-fraction", "DMLC_TASK_ID", "1.5"),
    xgb("task-id-equals-worker-count", "DMLC_TASK_ID", "2"),
    Case("completion-index-above-count", {**{k: v for k, v in XGBOOST_POD.items() if k != "DMLC_TASK_ID"},
                                          "JOB_COMPLETION_INDEX": "7"}, "JOB_COMPLETION_INDEX", "7", plan("xgboost")),
    xgb("num-worker-zero", "DMLC_NUM_WORKER", "0"),
    xgb("num-worker-negative", "DMLC_NUM_WORKER", "-2"),
    xgb("num-worker-word", "DMLC_NUM_WORKER", "four"),
    xgb("num-worker-with-unit", "DMLC_NUM_WORKER", "2 workers"),
    xgb("num-worker-huge", "DMLC_NUM_WORKER", "100001"),
    xgb("tracker-uri-bad-host", "DMLC_TRACKER_URI", "bad_host!"),
    xgb("tracker-uri-url", "DMLC_TRACKER_URI", "http://tj-node-0-0.tj"),
    xgb("tracker-uri-with-port", "DMLC_TRACKER_URI", "tj-node-0-0.tj:29500"),
    xgb("tracker-uri-bracketed-ipv6", "DMLC_TRACKER_URI", "[fd00::1]"),
    xgb("tracker-uri-blank", "DMLC_TRACKER_URI", " "),
    xgb_unset("tracker-uri-unset-for-two-workers", "DMLC_TRACKER_URI"),
    # G = 2 workers per pod (GPUs stand-in): the worker count must split into pods of 2.
    xgb("num-worker-not-a-multiple-of-gpus", "DMLC_NUM_WORKER", "3", LAUNCHER_XGBOOST_WORKERS_PER_POD="2"),
    xgb("pod-index-beyond-the-pods-gpus-make", "DMLC_TASK_ID", "1", LAUNCHER_XGBOOST_WORKERS_PER_POD="2"),
    xgb("tracker-knob-maybe", "LAUNCHER_XGBOOST_TRACKER", "maybe"),
    Case("tracker-flag-maybe", XGBOOST_POD, "--xgboost-tracker", "maybe",
         plan("xgboost", "--xgboost-tracker", "maybe")),
    xgb("workers-per-pod-zero", "LAUNCHER_XGBOOST_WORKERS_PER_POD", "0"),
    Case("workers-per-pod-flag-word", XGBOOST_POD, "--xgboost-workers-per-pod", "many",
         plan("xgboost", "--xgboost-workers-per-pod", "many")),
    xgb("rendezvous-timeout-word", "LAUNCHER_RENDEZVOUS_TIMEOUT", "soon"),
    # Each restart in place moves the tracker and its board 2 ports on: the last one must fit.
    xgb("port-without-room-for-the-restarts", "DMLC_TRACKER_PORT", "65534", LAUNCHER_MAX_RESTARTS="1"),
    xgb("run-python-port-without-room-for-the-restarts", "DMLC_TRACKER_PORT", "65533", python("xgboost"),
        LAUNCHER_MAX_RESTARTS="2"),
    xgb("run-port-word", "DMLC_TRACKER_PORT", "http", touch("xgboost")),
    xgb("run-task-id-equals-count", "DMLC_TASK_ID", "2", touch("xgboost")),
    xgb("run-python-num-worker-zero", "DMLC_NUM_WORKER", "0", python("xgboost")),
    xgb("run-python-not-a-multiple", "DMLC_NUM_WORKER", "5", python("xgboost"), LAUNCHER_XGBOOST_WORKERS_PER_POD="2"),
    Case("run-without-program", XGBOOST_POD, "PROGRAM", None, ("xgboost",)),
    Case("local-nnodes-zero", {}, "--nnodes", "0", local("xgboost", "--nnodes", "0")),
    Case("local-nproc-per-node-zero", {}, "--nproc-per-node", "0",
         local("xgboost", "--nnodes", "2", "--nproc-per-node", "0")),
    Case("local-nproc-per-node-word", {}, "--nproc-per-node", "gpu",
         local("xgboost", "--nnodes", "2", "--nproc-per-node", "gpu")),
    Case("local-without-program", {}, "PROGRAM", None, ("local", "--framework", "xgboost", "--nnodes", "2")),
), (
    ({"DMLC_TASK_ID": "2"}, ("a pod index from 0 to 1 (DMLC_NUM_WORKER=2)",)),
    ({"DMLC_NUM_WORKER": "3", "LAUNCHER_XGBOOST_WORKERS_PER_POD": "2"}, ("a multiple of the 2 workers this pod runs",)),
    ({"DMLC_TRACKER_URI": "tj-node-0-0.tj:29500"}, ("without a port",)),
), ("DMLC_TASK_ID", "x"))


# --- the harness -----------------------------------------------------------------------------------

FRAMEWORKS = (JAX, XGBOOST)
each_framework = pytest.mark.parametrize("framework", FRAMEWORKS, ids=[f.name for f in FRAMEWORKS])


def launcher(args: tuple[str, ...], extra: dict[str, str], started: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(CONTROLLER)}
    env.update(extra, PYTHONPATH=str(REPO))
    argv = [sys.executable, "-m", "launcher", *(a.replace("{started}", str(started)) for a in args)]
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def cases(in_process: bool) -> list:
    """``plan`` starts nothing: its cases run the CLI in this process (tests/cli_fixture.py); the
    subcommands that start the framework's runner or the nodes before they validate, as a process."""
    return [pytest.param(case, id=f"{framework.name}-{case.id}")
            for framework in FRAMEWORKS for case in framework.cases if (case.args[0] == "plan") == in_process]


def check_refused(case: Case, result: subprocess.CompletedProcess, started: Path) -> None:
    line = assert_one_line_naming(result, case.names, case.value)
    if case.value is None:
        assert "unset" in line, line
    assert not started.exists(), "nothing may start on bad input"


@pytest.mark.unit
@pytest.mark.parametrize("case", cases(in_process=True))
def test_bad_input_exits_2_with_one_line_naming_it(case: Case, tmp_path: Path, cli):
    started = tmp_path / "started"
    check_refused(case, cli([a.replace("{started}", str(started)) for a in case.args], case.env), started)


@pytest.mark.parametrize("case", cases(in_process=False))
def test_bad_input_to_a_command_that_starts_processes_first_exits_2_with_one_line_naming_it(case: Case, tmp_path: Path):
    started = tmp_path / "started"
    check_refused(case, launcher(case.args, case.env, started), started)


@pytest.mark.parametrize("framework, bad, expected", [
    pytest.param(framework, bad, expected, id=f"{framework.name}-{'-'.join(bad)}")
    for framework in FRAMEWORKS for bad, expected in framework.explained
])
def test_the_line_says_what_was_expected(framework: Framework, bad: dict[str, str], expected: tuple[str, ...],
                                         tmp_path: Path):
    said = launcher(plan(framework.name), {**framework.pod, **bad}, tmp_path / "started").stderr
    for words in expected:
        assert words in said


@each_framework
def test_the_runner_alone_refuses_a_bad_variable_in_one_line_too(framework: Framework):
    """launcher/<framework>/run.py run by hand (no launcher validated the variables)."""
    var, value = framework.by_hand
    env = {k: v for k, v in os.environ.items() if not k.startswith(CONTROLLER)}
    env.update(framework.pod, **{var: value})
    result = subprocess.run([sys.executable, str(REPO / "launcher" / framework.name / "run.py"), "-c", "pass"],
                            env=env, capture_output=True, text=True, timeout=60)
    assert_one_line_naming(result, var, value)


@each_framework
def test_there_are_at_least_15_cases_with_unique_ids(framework: Framework):
    assert len(framework.cases) >= 15
    assert len({case.id for case in framework.cases}) == len(framework.cases)
