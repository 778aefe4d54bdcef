"""In each torch rank: end the gloo process groups the program left up, at the last of the exit
handlers, while the interpreter can still run other threads' Python.

Torch issue 117762: a program that ends without ``destroy_process_group()`` leaves gloo's worker
threads to the interpreter's finalization. One of them may still be retiring the last collective
(a DistributedDataParallel job's last gradient all-reduce); dropping its tensors takes the GIL, and
during finalization that makes the thread exit inside a C++ destructor: "terminate called without
an active exception", SIGABRT, exit 134, after every epoch was done. Here, before finalization,
the groups are destroyed, each gloo backend's destructor (which releases the GIL) joins its
threads where nothing else holds the backend, and any thread that lives on is waited for until
it is idle.

Registered on import, at interpreter start (the sitecustomize of launcher/runner/hook), so it
runs after every exit handler the program registers. The exit code stays the interpreter's own.
It does nothing without torch.distributed. A program ending on an uncaught exception or a failing
``sys.exit`` keeps its groups (they close as the process ends); its threads only settle. Groups
that are not gloo alone (NCCL's teardown) are left to the program. Standard library only at
import, Python 3.8 syntax, never raises.
"""

import atexit
import sys

_asked = []  # type: list[object]  # the statuses the program gave sys.exit


def _exit(status=None):
    _asked.append(status)
    _program_exit(status)


_program_exit, sys.exit = sys.exit, _exit


def end_gloo_groups():
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return
    try:
        if not dist.is_available():
            return
        if dist.is_initialized() and not _failing() and _joins_without_the_gil(sys.modules.get("torch")):
            _end(dist)
        _settle()
    except Exception:  # noqa: BLE001 - the program's own ending goes on as it would have
        return


def _failing():
    """Whether the program is ending on a failure: an uncaught exception (printed), or a failing
    ``sys.exit(3)``. Its peers may then still be in a collective: its groups close as the process
    ends, as they would have, so that the peers see it gone only once its exit is there to be
    seen, and it stays the job's root cause. Its threads still settle first: the last collective
    it took part in may be retiring still, and an abort then would replace its exit code."""
    if hasattr(sys, "last_value") or hasattr(sys, "last_exc"):
        return True
    return bool(_asked) and _asked[-1] not in (None, 0)


def _joins_without_the_gil(torch):
    """Whether destroying a gloo group is safe here: torch 2.4's joins the group's threads holding
    the GIL, which one of them may be waiting for (a hang seen under Accelerate's own test scripts
    on torch 2.4.1, tests/test_matrix_accelerate.py); from 2.8 on, checked on 2.8, 2.13 and 2.15,
    it does not. Older releases only wait for the threads to settle."""
    try:
        major, minor = (int(part) for part in torch.__version__.split(".")[:2])
    except (AttributeError, ValueError):
        return False
    return (major, minor) >= (2, 8)


def _end(dist):
    """Destroy the groups if every one is gloo's, and join their threads where nothing else
    holds them."""
    groups = list(dist.distributed_c10d._world.pg_map)
    if not groups or any(dist.get_backend(group) != "gloo" for group in groups):
        return
    import torch

    # Held past destroy_process_group: the last reference to each backend then goes below,
    # through the binding's destructor, which releases the GIL while it joins the threads.
    backends = [group._get_backend(torch.device("cpu")) for group in groups]
    dist.destroy_process_group()
    del groups
    del backends


def _settle(most=2.0, pause=0.002):
    """Where something still holds a group (a DistributedDataParallel model: from torch 2.8 on,
    even one the program let go of; or a group the program destroyed itself), its worker threads
    live on into finalization. Wait, the GIL released, until each thread that is not Python's
    own has been seen asleep in two samples in a row (idle, or blocked on the network), so that
    none is left halfway through retiring a collective: one that wanted the GIL had it during
    the pause. At most ``most`` seconds."""
    import threading
    import time

    python = {thread.native_id for thread in threading.enumerate()}
    deadline = time.monotonic() + most
    asleep = set()  # type: set[str]
    settled = set()  # type: set[str]
    while time.monotonic() < deadline:
        time.sleep(pause)
        states = _states(python)
        now = {task for task, state in states.items() if state == "S"}
        settled |= now & asleep
        asleep = now
        if settled >= set(states):
            return


def _states(python):
    """Thread id -> scheduler state (R, S, D, ...), for each thread of this process that Python
    did not start: torch's and its libraries'."""
    import os

    states = {}
    for task in os.listdir("/proc/self/task"):
        if int(task) in python:
            continue
        try:
            with open(f"/proc/self/task/{task}/stat") as handle:
                stat = handle.read()
            states[task] = stat[stat.rindex(")") + 2]
        except (OSError, ValueError, IndexError):
            continue  # gone: it ended
    return states


atexit.register(end_gloo_groups)
