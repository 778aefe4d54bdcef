"""Shared helpers: run the real CLI as a subprocess, with a clean Trainer-like environment."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from launcher.local import nodes

REPO = Path(__file__).resolve().parents[1]
RANKS = str(REPO / "tests" / "programs" / "ranks.py")
IS_ROOT = os.geteuid() == 0 and shutil.which("unshare") is not None
needs_root = pytest.mark.skipif(not IS_ROOT, reason="needs root and unshare(1) for namespaces")


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without anything Trainer or the launcher would read."""
    env = {
        k: v for k, v in os.environ.items()
        if not k.startswith(("PET_", "LAUNCHER_", "TORCHELASTIC_", "EXPORT_")) and k not in ("JOB_COMPLETION_INDEX", "OMP_NUM_THREADS")
    }
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


def launcher(*args: str) -> list[str]:
    return [sys.executable, "-m", "launcher", *args]


# A port free now, below the ephemeral range (the launcher's own choice for `local`): under
# pytest-xdist no worker's outgoing connection is given it between the check and the bind.
free_port = nodes.free_port


class Job:
    """A launcher process started in the background, its output in files."""

    def __init__(self, argv: list[str], env: dict[str, str], workdir: Path, name: str = "job"):
        self.out = workdir / f"{name}.out"
        self.err = workdir / f"{name}.err"
        self.termination_log = workdir / f"{name}.termination.json"
        env = {"LAUNCHER_TERMINATION_LOG": str(self.termination_log), **env}
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.process = subprocess.Popen(argv, env=env, stdout=out, stderr=err, cwd=REPO)

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait(self, timeout: float = 120) -> int:
        return self.process.wait(timeout=timeout)

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    @property
    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def termination(self) -> dict:
        return json.loads(self.termination_log.read_text())


def wait_for(predicate, timeout: float = 60, what: str = "condition") -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def rank_reports(report_dir: Path) -> dict[int, dict]:
    return {int(p.stem): json.loads(p.read_text()) for p in report_dir.glob("*.json") if p.stem.isdigit()}


def alive(pid: int) -> bool:
    """Running, not a zombie (this machine's PID 1 does not reap orphans, so a dead orphan may linger as Z)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def report_dir(tmp_path: Path) -> Path:
    path = tmp_path / "ranks"
    path.mkdir()
    return path


@pytest.fixture
def notes_said_afresh(request: pytest.FixtureRequest):
    """A framework's ``compat.notes`` (versions.FeatureNotes, in the test module's ``compat``) says
    each feature off once per process: the test starts with nothing said yet, and leaves so."""
    said = request.module.compat.notes.said
    said.clear()
    yield
    said.clear()


def assert_one_line_naming(result: subprocess.CompletedProcess, names: str, value: str | None) -> str:
    output = result.stdout + result.stderr
    assert "Traceback" not in output, output
    assert result.returncode == 2, f"exit {result.returncode}, expected 2\n{output}"
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].strip(), f"expected exactly one stderr line, got {lines!r}"
    assert result.stdout == "", f"nothing should be printed on stdout: {result.stdout!r}"
    line = lines[0]
    assert names in line, f"{names!r} not named in {line!r}"
    if value is not None:
        shown = repr(value) if not value.strip() else value
        assert shown in line, f"bad value {shown!r} not repeated in {line!r}"
    return line


_ENTER_PRIVATE_NAMES = 'mount --bind "$0" /etc/hosts && mount --bind "$1" /etc/resolv.conf && shift && exec "$@"'


def with_private_names(tmp_path: Path, argv: list[str]) -> tuple[list[str], Path]:
    """``argv`` in a mount namespace with a private /etc/hosts (returned, to add names to) and a
    resolv.conf pointing at loopback: no lookup of a made-up name ever leaves this machine."""
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n")
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", _ENTER_PRIVATE_NAMES, str(hosts), str(resolv), *argv], hosts


pytest_plugins = [
    "image_fixtures",  # built images (buildah), the podman engine and network
    "storage_servers",  # real S3 (moto server), hub and fault-proxy servers
    "status_fixtures",  # the Trainer status server stand-in (tests/status_server.py)
    "fuzz",  # the property-based tests' profiles (LAUNCHER_FUZZ)
    "tiers",  # unit, integration, system: each test marked, a unit test refused a process
    "cli_fixture",  # the CLI in the test's own process, for the bad-input tables
    "parallel",  # what stays in one worker when pytest-xdist spreads the suite (-n)
    "bytecode",  # the launcher compiled once; pytest caches its rewritten test modules (tests/bytecode.py)
]
