"""The version gate of the frameworks that run a Python runner per pod (launcher/jax/run.py and
launcher/xgboost/run.py, through launcher/core/versions.py), checked before the runner imports its
framework; the framework's own internals behind feature checks are tests/test_jax_compat.py's and
tests/test_xgboost_compat.py's.

The gate runs in the user's interpreter, loaded by path as the launcher runs it. A framework outside
its range is not installed anywhere here, so the gate's refusal is driven by an explicit version
string; the run with the real, supported framework installed here is real. Every test runs for each
framework (its id names it: ``[jax]``, ``[xgboost]``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import assert_one_line_naming, clean_env, free_port

from launcher.core import versions

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Gate:
    framework: str
    expected: str  # what the refusal and the warning say was expected
    below: str  # a version under the floor
    above: str  # a version at the ceiling
    supported: tuple[str, ...]
    call: str  # the runner's gate called with {version!r} (and {report!r}, where the report goes)
    variables: Callable[[Path], dict[str, str]]  # a pod's variables, its report at the given path
    reported: dict[str, object]  # what the refusal's report holds besides what every runner's does
    job_code: str  # a one-process job on the installed framework, printing its result and the knob
    job_variables: Callable[[], dict[str, str]]
    job_printed: str
    job_timeout: float

    @property
    def runner(self) -> Path:
        return REPO / "launcher" / self.framework / "run.py"


def pod_env(**variables: str) -> dict[str, str]:
    """This process's environment without anything Trainer, the launcher or a framework would read."""
    env = {k: v for k, v in clean_env().items() if not k.startswith(("JAX_", "DMLC_"))}
    env.update(variables)
    return env


JAX = Gate(
    "jax", "expected jax >=0.5,<0.11", "0.4.38", "0.11.0", ("0.5.0", "0.7.2", "0.10.2", "0.10.3.dev20260101"),
    # process 1 of 2, reporting where the launcher would read it
    "run.version_gate(run.Config(dict(os.environ)), {version!r})",
    lambda report: {"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1", "JAX_COORDINATOR_ADDRESS": "127.0.0.1:29500",
                    "TRAINER_LAUNCHER_JAX_REPORT": str(report), "HOSTNAME": "tj-node-0-1"},
    {"node": "tj-node-0-1"},
    ("import os, jax; jax.distributed.initialize(); "
     "print('world', jax.process_count(), os.environ['LAUNCHER_ALLOW_UNTESTED_VERSIONS'])"),
    lambda: {"JAX_NUM_PROCESSES": "1", "JAX_PROCESS_ID": "0", "HOSTNAME": "tj-node-0-0",
             "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{free_port()}"},
    "world 1 1", 240)
XGBOOST = Gate(
    "xgboost", "expected xgboost >=2.1,<3.3", "2.0.3", "3.3.0", ("2.1.0", "2.1.4", "3.2.0", "3.2.1+cu126"),
    # the DMLC_* values of task 1 of 2, and a report file
    "run.version_gate(None, {report!r}, {version!r})",
    lambda report: {"DMLC_TRACKER_URI": "127.0.0.1", "DMLC_TRACKER_PORT": "29500", "DMLC_TASK_ID": "1",
                    "DMLC_NUM_WORKER": "2"},
    {},
    ("import os, numpy as np\nfrom xgboost import collective as c\n"
     "print('sum', c.allreduce(np.array([1.0]), c.Op.SUM)[0], os.environ['LAUNCHER_ALLOW_UNTESTED_VERSIONS'])\n"),
    lambda: {"DMLC_TRACKER_URI": "127.0.0.1", "DMLC_TRACKER_PORT": str(free_port()), "DMLC_TASK_ID": "0",
             "DMLC_NUM_WORKER": "1"},
    "sum 1.0 1", 120)
GATES = (JAX, XGBOOST)
each_framework = pytest.mark.parametrize("framework", GATES, ids=[g.framework for g in GATES])


def gate(framework: Gate, tmp_path: Path, version: str, **extra: str) -> tuple[subprocess.CompletedProcess, Path]:
    """The runner's gate as it runs: run.py loaded by path (not as part of the package) in a
    separate interpreter, with a pod's variables and a report file; it prints whether it went on
    and whether the framework was imported by then."""
    report = tmp_path / "report.json"
    code = ("import importlib.util, os, sys\n"
            f"spec = importlib.util.spec_from_file_location('run', {str(framework.runner)!r})\n"
            "run = importlib.util.module_from_spec(spec)\n"
            "spec.loader.exec_module(run)\n"
            f"{framework.call.format(version=version, report=str(report))}\n"
            f"print('went on', {framework.framework!r} in sys.modules)\n")
    env = pod_env(**framework.variables(report), **extra)
    result = subprocess.run([sys.executable, "-c", code], cwd="/", env=env, capture_output=True, text=True,
                            timeout=60)
    return result, report


@each_framework
def test_a_version_below_the_floor_is_refused_with_exit_2_in_one_line(framework: Gate, tmp_path):
    name = framework.framework
    result, report = gate(framework, tmp_path, framework.below)
    line = assert_one_line_naming(result, framework.expected, f"{name}={framework.below!r}")
    said = versions.refusal(name, framework.below)
    assert line == f"trainer-launcher: {name}: {said}"
    assert json.loads(report.read_text()) == {"ending": "refused", "exitCode": 2, "reason": "UnsupportedVersion",
                                              "rank": 1, "error": said, **framework.reported}


@each_framework
def test_a_version_above_the_ceiling_is_refused_too(framework: Gate, tmp_path):
    result, _ = gate(framework, tmp_path, framework.above)
    assert_one_line_naming(result, framework.expected, f"{framework.framework}={framework.above!r}")


@each_framework
def test_allowed_untested_version_runs_with_one_warning_line(framework: Gate, tmp_path):
    name = framework.framework
    result, report = gate(framework, tmp_path, framework.below, LAUNCHER_ALLOW_UNTESTED_VERSIONS="1")
    assert result.returncode == 0, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"trainer-launcher: {name}: warning: {name}={framework.below!r}: {framework.expected}")
    assert line.endswith("running it anyway (LAUNCHER_ALLOW_UNTESTED_VERSIONS=1)")
    assert result.stdout == "went on False\n"  # checked before the framework was imported
    assert not report.exists()


@pytest.mark.parametrize("framework, version", [
    pytest.param(framework, version, id=f"{framework.framework}-{version}")
    for framework in GATES for version in framework.supported
])
def test_a_supported_version_passes_the_gate_without_a_word(framework: Gate, version, tmp_path):
    result, _ = gate(framework, tmp_path, version)
    assert (result.returncode, result.stderr, result.stdout) == (0, "", "went on False\n")


@each_framework
def test_a_real_job_on_the_installed_framework_says_nothing_about_versions(framework: Gate):
    """This interpreter's framework (in range): the gate reads it from the installed metadata, and
    ``--allow-untested-versions 1`` changes nothing but reaching the runner as its variable."""
    name = framework.framework
    result = subprocess.run([sys.executable, "-m", "launcher", name, "--allow-untested-versions", "1", "--",
                             sys.executable, "-c", framework.job_code], cwd=REPO,
                            env=pod_env(**framework.job_variables()), capture_output=True, text=True,
                            timeout=framework.job_timeout)
    assert result.returncode == 0, result.stderr
    assert framework.job_printed in result.stdout
    assert "warning" not in result.stderr and f"expected {name}" not in result.stderr
    assert " is off: " not in result.stderr
