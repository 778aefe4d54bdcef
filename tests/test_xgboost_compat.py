"""launcher/xgboost/compat.py (xgboost's internals, behind feature checks) and the runner's version
gate (launcher/core/versions.py, checked before ``import xgboost``).

The hooks run for real on every xgboost of the matrix (tests/test_matrix_xgboost.py: 2.1.4, whose
tracker ignores its port, and 3.2.0). Here: what each does where its hook is missing, said once;
the tracker's socket move, on real sockets; and the gate, in the user's interpreter, loaded by path
as the launcher runs it. An xgboost outside the range is not installed anywhere here, so the gate's
refusal is driven by an explicit version string; the run with a real, supported xgboost is real.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
import sys
import types
from pathlib import Path

import pytest

from conftest import assert_one_line_naming, clean_env, free_port
from launcher.core import versions
from launcher.xgboost import run as runner

REPO = Path(__file__).resolve().parents[1]
RUNNER = REPO / "launcher" / "xgboost" / "run.py"
compat = runner.compat


@pytest.fixture(autouse=True)
def fresh_said():
    compat.notes.said.clear()
    yield
    compat.notes.said.clear()


# --- the version gate, in the runner ---------------------------------------------------------------

def gate(tmp_path: Path, version: str, **extra: str) -> tuple[subprocess.CompletedProcess, Path]:
    """The runner's gate as it runs: run.py loaded by path (not as part of the package) in a
    separate interpreter, with the DMLC_* values of task 1 of 2 and a report file."""
    report = tmp_path / "report.json"
    code = ("import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('run', {str(RUNNER)!r})\n"
            "run = importlib.util.module_from_spec(spec)\n"
            "spec.loader.exec_module(run)\n"
            f"run.version_gate(None, {str(report)!r}, {version!r})\n"
            "print('went on', 'xgboost' in sys.modules)\n")
    env = {k: v for k, v in clean_env().items() if not k.startswith("DMLC_")}
    env.update(DMLC_TRACKER_URI="127.0.0.1", DMLC_TRACKER_PORT="29500", DMLC_TASK_ID="1", DMLC_NUM_WORKER="2",
               **extra)
    result = subprocess.run([sys.executable, "-c", code], cwd="/", env=env, capture_output=True, text=True,
                            timeout=60)
    return result, report


def test_an_xgboost_below_the_floor_is_refused_with_exit_2_in_one_line(tmp_path):
    result, report = gate(tmp_path, "2.0.3")
    line = assert_one_line_naming(result, "expected xgboost >=2.1,<3.3", "xgboost='2.0.3'")
    said = versions.refusal("xgboost", "2.0.3")
    assert line == f"trainer-launcher: xgboost: {said}"
    assert json.loads(report.read_text()) == {"ending": "refused", "exitCode": 2, "rank": 1, "error": said,
                                              "reason": "UnsupportedVersion"}


def test_an_xgboost_above_the_ceiling_is_refused_too(tmp_path):
    result, _ = gate(tmp_path, "3.3.0")
    assert_one_line_naming(result, "expected xgboost >=2.1,<3.3", "xgboost='3.3.0'")


def test_allowed_untested_version_runs_with_one_warning_line(tmp_path):
    result, report = gate(tmp_path, "2.0.3", LAUNCHER_ALLOW_UNTESTED_VERSIONS="1")
    assert result.returncode == 0, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("trainer-launcher: xgboost: warning: xgboost='2.0.3': expected xgboost >=2.1,<3.3")
    assert line.endswith("running it anyway (LAUNCHER_ALLOW_UNTESTED_VERSIONS=1)")
    assert result.stdout == "went on False\n"  # checked before xgboost was imported
    assert not report.exists()


@pytest.mark.parametrize("version", ["2.1.0", "2.1.4", "3.2.0", "3.2.1+cu126"])
def test_a_supported_xgboost_passes_the_gate_without_a_word(tmp_path, version):
    result, _ = gate(tmp_path, version)
    assert (result.returncode, result.stderr, result.stdout) == (0, "", "went on False\n")


def test_a_real_job_on_the_installed_xgboost_says_nothing_about_versions(tmp_path):
    """This interpreter's xgboost (in range): the gate reads it from the installed metadata, and
    ``--allow-untested-versions 1`` changes nothing but reaching the runner as its variable."""
    code = ("import os, numpy as np\nfrom xgboost import collective as c\n"
            "print('sum', c.allreduce(np.array([1.0]), c.Op.SUM)[0], os.environ['LAUNCHER_ALLOW_UNTESTED_VERSIONS'])\n")
    env = {k: v for k, v in clean_env().items() if not k.startswith("DMLC_")}
    env.update(DMLC_TRACKER_URI="127.0.0.1", DMLC_TRACKER_PORT=str(free_port()), DMLC_TASK_ID="0",
               DMLC_NUM_WORKER="1")
    result = subprocess.run([sys.executable, "-m", "launcher", "xgboost", "--allow-untested-versions", "1", "--",
                             sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "sum 1.0 1" in result.stdout
    assert "warning" not in result.stderr and "expected xgboost" not in result.stderr and " is off: " not in result.stderr


# --- the tracker's port ---------------------------------------------------------------------------

class ChoosesItsOwnPort:
    """A tracker as xgboost 2.1.x builds one: it listens on a port the OS chose, whatever `port`
    says, non-blocking (what the native tracker sets before it accepts)."""

    def __init__(self, n_workers, host_ip, port=0, sortby="host"):
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind((host_ip, 0))
        self.listener.listen(n_workers)
        self.listener.setblocking(False)
        self.asked = port


def test_a_tracker_on_a_port_of_its_own_choosing_is_moved_onto_the_port_asked_for():
    port = free_port()
    tracker = compat.tracker_on_port(ChoosesItsOwnPort, 2, "127.0.0.1", port, sortby="task")
    try:
        assert tracker.listener.getsockname() == ("127.0.0.1", port)
        assert fcntl.fcntl(tracker.listener.fileno(), fcntl.F_GETFL) & os.O_NONBLOCK
        with socket.create_connection(("127.0.0.1", port), timeout=5) as worker:
            tracker.listener.setblocking(True)
            accepted, address = tracker.listener.accept()
            accepted.close()
            assert address == worker.getsockname()  # the worker's own address, as the tracker records it
    finally:
        tracker.listener.close()


def test_a_port_already_taken_is_an_oserror_naming_the_bind():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        with pytest.raises(OSError, match="Failed to bind socket"):
            compat.tracker_on_port(ChoosesItsOwnPort, 2, "127.0.0.1", holder.getsockname()[1])


def test_on_the_installed_xgboost_the_tracker_listens_where_asked():
    from xgboost.tracker import RabitTracker

    port = free_port()
    tracker = compat.tracker_on_port(RabitTracker, 1, "127.0.0.1", port, sortby="task")
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        pass
    tracker.free()


# --- hooks missing: that feature is off, said once, the rest works -----------------------------------

def test_a_collective_without_init_joins_nothing_and_says_so_once(capsys):
    bare = types.SimpleNamespace(CommunicatorContext=object)
    restores = [compat.join_collective(bare, print, print) for _ in range(2)]
    for restore in restores:
        restore()
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"trainer-launcher: xgboost {compat.xgboost_version()}: joining the program's own "
                           "collective.init() and CommunicatorContext() is off: ")
    assert not hasattr(bare, "init")


def test_a_context_that_does_not_call_init_is_said_and_direct_calls_still_join(capsys):
    module = types.ModuleType("collective")
    exec("def init(**a): pass\ndef finalize(): pass\n"
         "class CommunicatorContext:\n    def __enter__(self): return self\n    def __exit__(self, *a): pass\n",
         vars(module))
    real_init, ours = module.init, lambda **a: None
    restore = compat.join_collective(module, ours, ours)
    assert module.init is ours and module.finalize is ours
    restore()
    assert module.init is real_init
    assert "joining the program's own CommunicatorContext() is off: its __enter__/__exit__ do not call" in \
        capsys.readouterr().err


def test_the_installed_xgboost_has_every_hook(capsys):
    import xgboost
    from xgboost import collective, tracker

    restores = [compat.join_collective(collective, collective.init, collective.finalize),
                compat.stand_in_tracker(xgboost, tracker, 29500, 2, dict)]
    try:
        assert xgboost.RabitTracker is tracker.RabitTracker and xgboost.RabitTracker.__module__ == "xgboost.tracker"
        stand_in = xgboost.RabitTracker(n_workers=2, host_ip="0.0.0.0", port=29500)
        stand_in.start()
        stand_in.wait_for()
        del stand_in  # __del__ -> free(): nothing to free
    finally:
        for restore in restores:
            restore()
    assert capsys.readouterr().err == ""


def test_a_tracker_class_without_the_parameters_is_not_stood_in_for(capsys):
    class Tracker:
        def __init__(self, workers):
            pass

    package, module = types.SimpleNamespace(RabitTracker=Tracker), types.SimpleNamespace(RabitTracker=Tracker)
    compat.stand_in_tracker(package, module, 29500, 2, dict)()
    assert package.RabitTracker is Tracker and module.RabitTracker is Tracker
    assert "standing in for the program's RabitTracker on DMLC_TRACKER_PORT is off" in capsys.readouterr().err
