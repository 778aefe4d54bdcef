"""The launcher's own crash is reported as the launcher's (exit 70, LauncherError, its version and
the frame), never as the user's program failing.

A fault is injected through a sitecustomize module that replaces one launcher function with one
that raises, compiled under that function's own file name: to the launcher it is a bug in its
own code, as a broken hook would be. Everything else is real: the launcher, torchrun, the
runners and the programs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, RANKS, clean_env, launcher
from launcher import __version__
from launcher.core.outcome import DEFAULT_RETRYABLE_EXIT_CODES, INTERNAL_ERROR, is_retryable

TRAINER_ENV = {"PET_NNODES": "1", "PET_NPROC_PER_NODE": "2", "PET_NODE_RANK": "0"}

INJECT = """
import importlib.util
import sys

def load(name, path):
    if name.startswith("launcher."):
        return importlib.import_module(name)
    # a runner's sibling, loaded by path under its own name (launcher/jax/run.py load_sibling)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module

import importlib
target = load({module!r}, {path!r})

class Fault({base}):
    pass

BROKEN = "def {function}(*args, **kwargs):\\n    raise Fault('injected launcher fault')\\n"
exec(compile(BROKEN, target.__file__, "exec"), {{**target.__dict__, "Fault": Fault}}, namespace := {{}})
setattr(target, {function!r}, namespace[{function!r}])
"""


def inject(tmp_path: Path, module: str, function: str, path: str = "", base: str = "RuntimeError") -> str:
    """PYTHONPATH with a sitecustomize that breaks one launcher function in every process."""
    hook = tmp_path / "inject"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(INJECT.format(module=module, function=function, path=path, base=base))
    return f"{hook}:{clean_env()['PYTHONPATH']}"


def run(tmp_path: Path, argv: list[str], pythonpath: str, **env: str) -> tuple[subprocess.CompletedProcess, dict]:
    log = tmp_path / "termination.json"
    result = subprocess.run(argv, env=clean_env(PYTHONPATH=pythonpath, LAUNCHER_TERMINATION_LOG=str(log), **env),
                            capture_output=True, text=True, timeout=180)
    return result, json.loads(log.read_text())


def assert_launcher_error(result: subprocess.CompletedProcess, message: dict, frame: str) -> None:
    assert result.returncode == INTERNAL_ERROR, result.stderr
    assert message["reason"] == "LauncherError" and message["retryable"] is False, message
    assert "not your program" in message["message"] and "injected launcher fault" in message["message"], message
    assert f"trainer-launcher {__version__}" in message["message"]
    assert frame in message["message"], message["message"]
    assert "exit 70 (permanent, LauncherError)" in result.stderr.strip().splitlines()[-1], result.stderr


@pytest.mark.parametrize("module,function,frame", [
    # in the launcher process, before the job starts
    ("launcher.core.workspace", "warn_if_unwritable", "launcher/core/workspace.py"),
    # in the torch agent, as it installs its hooks into torchrun
    ("launcher.torch.compat", "terminate_once", "launcher/torch/compat.py"),
], ids=["launcher", "agent"])
def test_the_launchers_own_crash_in_a_torch_job_is_a_launcher_error(tmp_path, module, function, frame):
    result, message = run(tmp_path, launcher("torch", "--", RANKS), inject(tmp_path, module, function), **TRAINER_ENV)
    assert_launcher_error(result, message, frame)


def test_a_launcher_error_is_retried_where_the_user_asks_for_it(tmp_path):
    assert not is_retryable(INTERNAL_ERROR, DEFAULT_RETRYABLE_EXIT_CODES)
    result, message = run(tmp_path, launcher("torch", "--", RANKS),
                          inject(tmp_path, "launcher.core.workspace", "warn_if_unwritable"),
                          LAUNCHER_RETRYABLE_EXIT_CODES="70,137,138,143", **TRAINER_ENV)
    assert result.returncode == INTERNAL_ERROR and message["retryable"] is True


def test_a_crashed_agent_without_a_report_is_the_launchers_failure(tmp_path):
    """The agent dies of an exception that escapes every handler (a BaseException, where it binds
    torchrun's workers): no report, exit 1. That is not the program's exit 1."""
    result, message = run(tmp_path, launcher("torch", "--", RANKS),
                          inject(tmp_path, "launcher.torch.compat", "bind_workers", base="BaseException"),
                          **TRAINER_ENV)
    assert result.returncode == INTERNAL_ERROR, result.stderr
    assert message["reason"] == "LauncherError" and "injected launcher fault" in message["message"]


def test_the_jax_runners_own_crash_is_a_launcher_error(tmp_path):
    """Two JAX processes: the runner's coordination store (launcher/jax/compat.py) breaks."""
    compat = str(REPO / "launcher" / "jax" / "compat.py")
    program = str(REPO / "tests" / "programs" / "jax_world.py")
    result, message = run(tmp_path, launcher("local", "--framework", "jax", "--nnodes", "2", "--", sys.executable,
                                             program),
                          inject(tmp_path, "_trainer_launcher_jax_compat", "coordination_store", compat))
    assert_launcher_error(result, message, "launcher/jax/compat.py")


def test_the_xgboost_runners_own_crash_is_a_launcher_error(tmp_path):
    """Two XGBoost workers: the runner's join of the collective (launcher/xgboost/compat.py) breaks."""
    compat = str(REPO / "launcher" / "xgboost" / "compat.py")
    program = str(REPO / "tests" / "programs" / "xgboost_train.py")
    result, message = run(tmp_path, launcher("local", "--framework", "xgboost", "--nnodes", "2", "--",
                                             sys.executable, program),
                          inject(tmp_path, "_trainer_launcher_xgboost_compat", "join_collective", compat))
    assert_launcher_error(result, message, "launcher/xgboost/compat.py")
