"""The suite's tiers (DESIGN.md, "Tests that prove it, in tiers"): every test file is in one, and
each test carries its tier's mark.

- ``unit``: in-process, starting no process (plans, tables, parsers, the bad-input tables through
  ``cli.main``, servers on threads of the test's own process). A unit test that starts a process
  fails, saying so: it belongs to the integration tier. ``pytest -m unit`` runs them in seconds.
- ``integration``: real processes and servers on this machine: multi-process gloo runs, each MPI's
  own ``mpirun``, moto's S3 server, the hub and status stand-ins, fault proxies, signals and PID
  namespaces. Every file not named below.
- ``system``: what needs the machine's engines or other machines' shapes: images built with
  buildah and run with podman, the Kubeflow SDK, MPI over sshd, the version matrix.

The README's test command runs every tier; ``-m "not system"`` leaves out the slowest.
"""

from __future__ import annotations

import os
import subprocess

import pytest

UNIT = frozenset({
    "test_accelerate_plan", "test_devices", "test_docs_pages", "test_fuzz_parsers", "test_hang_unit", "test_init_lanes",
    "test_inplace", "test_install", "test_layers", "test_lobby", "test_mpi_plan", "test_outcome", "test_smoke_checks", "test_smoke_skus", "test_torch_plan",
})
SYSTEM = frozenset({
    "test_images", "test_image_trixie", "test_release", "test_sdk", "test_mpi_framework_images", "test_mpi",
    "test_matrix_accelerate", "test_matrix_torch", "test_matrix_jax", "test_matrix_xgboost", "test_matrix_mpi",
})
TIERS = ("unit", "integration", "system")


def tier_of(module: str) -> str:
    """The tier of the test file named ``module`` (``test_cli``, or a dotted path ending in it)."""
    name = module.rsplit(".", 1)[-1]
    return "unit" if name in UNIT else "system" if name in SYSTEM else "integration"


def pytest_configure(config: pytest.Config) -> None:
    for tier in TIERS:
        config.addinivalue_line("markers", f"{tier}: the {tier} tier (tests/tiers.py)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each test gets its file's tier, unless it names its own (``@pytest.mark.unit`` on an
    in-process table in a file whose other tests start the real CLI)."""
    for item in items:
        module = getattr(item, "module", None)
        if module is not None and not any(item.get_closest_marker(tier) for tier in TIERS):
            item.add_marker(tier_of(module.__name__))


class StartedAProcess(AssertionError):
    pass


@pytest.fixture(autouse=True)
def _a_unit_test_starts_no_process(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.node.get_closest_marker("unit") is None:
        return

    def refuse(*args, **kwargs):
        raise StartedAProcess(f"{request.node.nodeid} started a process: it belongs to the integration tier "
                              "(tests/tiers.py)")

    monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse)
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system", "execv", "execve"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, refuse)
