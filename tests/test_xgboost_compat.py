"""launcher/xgboost/compat.py: xgboost's internals, behind feature checks.

The hooks run for real on every xgboost of the matrix (tests/test_matrix_xgboost.py: 2.1.4, whose
tracker ignores its port, and 3.2.0). Here: what each does where its hook is missing, said once;
and the tracker's socket move, on real sockets. The runner's version gate (launcher/core/versions.py,
checked before ``import xgboost``) is tested with JAX's, in tests/test_runner_versions.py.
"""

from __future__ import annotations

import fcntl
import os
import socket
import types

import pytest
from conftest import free_port

from launcher.xgboost import run as runner

compat = runner.compat

pytestmark = pytest.mark.usefixtures("notes_said_afresh")


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
