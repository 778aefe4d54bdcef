"""What users bring: the supported ranges, refused at start in one line; the installed
torchrun's flags; torch's private hooks, each off on its own where torch lacks it.

The "installed" versions here are real distributions on the interpreter's path: a dist-info
directory that says torch 2.3.1, ahead of the real torch, is what importlib.metadata (and pip)
see in an image that carries torch 2.3.1. Nothing in the launcher is patched.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import RANKS, assert_one_line_naming, clean_env, launcher
from launcher.core import versions

TRAINER_ENV = {"PET_NNODES": "1", "PET_NPROC_PER_NODE": "2", "PET_NODE_RANK": "0"}


def fake_distribution(root: Path, name: str, version: str) -> Path:
    """A distribution as pip leaves it, metadata only: enough for importlib.metadata."""
    info = root / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return root


@pytest.mark.parametrize("version,admitted", [
    ("2.4.0", True), ("2.4.1+cu121", True), ("2.15.0+cu132", True), ("2.13.0+cpu", True),
    ("2.3.1", False), ("2.16.0", False), ("2.16.0.dev20261101", False), ("1.13.1", False),
])
def test_the_torch_range_admits_what_the_matrix_tests(version, admitted):
    assert versions.SUPPORTED["torch"].admits(version) is admitted


def test_every_tested_version_is_in_its_own_range():
    for rule in versions.SUPPORTED.values():
        for tested in rule.tested:
            assert rule.admits(tested), f"{rule.package} {tested} is tested but outside {rule.spec}"


def test_pyproject_extras_carry_the_same_ranges():
    import tomllib

    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    for extra, package in (("torch", "torch"), ("jax", "jax"), ("xgboost", "xgboost"), ("mpi", "mpi4py")):
        assert f"{package}{versions.SUPPORTED[package].spec}" in extras[extra], extras[extra]
    python = versions.SUPPORTED["python"]
    assert project["requires-python"] == python.spec


def test_a_torch_below_the_floor_is_refused_at_start_in_one_line(tmp_path):
    site = fake_distribution(tmp_path / "site", "torch", "2.3.1")
    env = clean_env(**TRAINER_ENV, PYTHONPATH=f"{site}:{clean_env()['PYTHONPATH']}")
    result = subprocess.run(launcher("torch", "--", RANKS), env=env, capture_output=True, text=True, timeout=60)
    line = assert_one_line_naming(result, "torch", "2.3.1")
    assert ">=2.4,<2.16" in line and "UnsupportedVersion" in line and "LAUNCHER_ALLOW_UNTESTED_VERSIONS" in line


def test_plan_refuses_it_too_and_the_knob_runs_it_with_one_warning(tmp_path):
    site = fake_distribution(tmp_path / "site", "torch", "2.16.0")
    env = clean_env(**TRAINER_ENV, PYTHONPATH=f"{site}:{clean_env()['PYTHONPATH']}")
    refused = subprocess.run(launcher("plan", "--", "train.py"), env=env, capture_output=True, text=True, timeout=60)
    assert_one_line_naming(refused, "torch", "2.16.0")
    allowed = subprocess.run(launcher("plan", "--allow-untested-versions", "1", "--", "train.py"), env=env,
                             capture_output=True, text=True, timeout=60)
    assert allowed.returncode == 0, allowed.stderr
    assert json.loads(allowed.stdout)["argv"][-1] == "train.py"
    warnings = [line for line in allowed.stderr.splitlines() if "untested" in line]
    assert len(warnings) == 1 and "torch='2.16.0'" in warnings[0], allowed.stderr


def test_a_torchrun_flag_of_the_installed_torch_passes_and_one_it_lacks_is_its_own_error():
    """The installed torchrun's grammar (read from its source, launcher.torch.compat) decides:
    --virtual-local-rank exists in torch 2.13, --no-such-flag in none."""
    env = clean_env(**TRAINER_ENV)
    plan = subprocess.run(launcher("plan", "--", "--virtual-local-rank", "train.py"), env=env, capture_output=True,
                          text=True, timeout=60)
    assert plan.returncode == 0, plan.stderr
    assert "--virtual-local-rank" in json.loads(plan.stdout)["argv"]
    refused = subprocess.run(launcher("plan", "--", "--no-such-flag", "train.py"), env=env, capture_output=True,
                             text=True, timeout=60)
    line = assert_one_line_naming(refused, "--no-such-flag", None)
    assert "torchrun: error: unrecognized arguments: --no-such-flag" in line


def test_the_compatibility_page_states_the_ranges_versions_py_holds():
    from matrix_report import POLICY_BEGIN, POLICY_END, policy_table

    page = (Path(__file__).parents[1] / "docs" / "compatibility.md").read_text()
    section = page.split(POLICY_BEGIN, 1)[1].split(POLICY_END, 1)[0].strip()
    assert section == policy_table(), "docs/compatibility.md is stale: python -m tests.docs_pages --write"


# --- a torch without a hook: the feature is off, said once, and the rest still works ----------
# Every torch in the matrix has every hook (the matrix asserts no "is off" line), and each hook
# patches something torch itself calls, so hiding one from a real torch run would break torch,
# not simulate an older one. These run the hooks in-process against torch 2.13 with the one
# attribute taken away, as a torch without it would look to them.


def test_without_a_popen_to_wrap_binding_is_off_said_once_and_ranks_are_found_as_children(monkeypatch, capfd):
    from torch.distributed.elastic.multiprocessing.subprocess_handler import subprocess_handler as module

    from launcher.torch import compat

    monkeypatch.delattr(module, "Popen")
    monkeypatch.setattr(compat.notes, "said", set())
    assert compat.bind_workers([], lambda: None) is False
    assert compat.bind_workers([], lambda: None) is False
    off = [line for line in capfd.readouterr().err.splitlines() if "is off" in line]
    assert len(off) == 1 and "binding ranks to the agent's life is off" in off[0] and "torch 2." in off[0]
    child = subprocess.Popen(["sleep", "30"])
    try:
        found = {worker.pid: worker for worker in compat.child_processes()}
        assert found[child.pid].poll() is None
        child.kill()
        child.wait()
    finally:
        child.kill()


def test_a_close_without_a_timeout_leaves_the_grace_off_said_once(monkeypatch, capfd):
    from torch.distributed.elastic.multiprocessing.api import PContext

    from launcher.torch import compat

    monkeypatch.setattr(PContext, "close", lambda self, death_sig=None: None)
    monkeypatch.setattr(compat.notes, "said", set())
    assert compat.stop_within_grace(5) is False
    err = capfd.readouterr().err
    assert "the grace period for ranks ignoring SIGTERM is off" in err and "30 s" in err


def test_on_a_torch_with_every_hook_each_one_is_on(monkeypatch):
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.multiprocessing import api
    from torch.distributed.elastic.multiprocessing.subprocess_handler import subprocess_handler as module

    from launcher.torch import compat

    for owner, name in ((module, "Popen"), (api.PContext, "close"), (LocalElasticAgent, "_stop_workers"),
                        (LocalElasticAgent, "_monitor_workers"), (api, "_terminate_process_handler")):
        monkeypatch.setattr(owner, name, getattr(owner, name))  # restored after the test
    assert compat.bind_workers([], lambda: None)
    assert compat.stop_within_grace(5)
    assert compat.terminate_once()
    assert compat.publish_final_failures(lambda failures: None)


@pytest.mark.parametrize("version,refused", [("3.10.14", True), ("3.11.7", False), ("3.12.3", False),
                                             ("3.13.5", False), ("3.14.0", True)])
def test_python_outside_3_11_to_3_13_is_refused_in_one_line(version, refused):
    line = versions.refusal("python", version)
    assert (line is not None) is refused
    if refused:
        assert line.startswith(f"python='{version}': expected python >=3.11,<3.14") and "\n" not in line
