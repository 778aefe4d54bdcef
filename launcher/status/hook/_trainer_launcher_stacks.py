"""Registers this process's stack dump (see sitecustomize.py beside it), once, on import.

Imported by the sitecustomize beside it at interpreter start, and by a framework's runner that
started before the hook was on its PYTHONPATH (launcher/jax/run.py, launcher/xgboost/run.py), once
the launcher's variables have reached it. Standard library only, Python 3.8 syntax, never raises.
"""

import os

_DIR_ENV = "LAUNCHER_STACKS_DIR"
# Set in a registered process's environment: Python processes it starts (spawned data-loader or
# compile workers) see their parent's pid there and stay out, so each rank has one dump file.
_OWNER_ENV = "LAUNCHER_STACKS_OWNER"
_SIGNAL_OFFSET = 5  # SIGRTMIN + 5: clear of the first few real-time signals that libraries take


def _start_time():
    """The process's start time in clock ticks (/proc/self/stat field 22): with the pid, it tells
    the launcher that a pid still names this process and was not reused."""
    with open("/proc/self/stat", "rb") as handle:
        stat = handle.read()
    return int(stat[stat.rindex(b")") + 2:].split()[19])


def _first(*names):
    for name in names:
        value = os.environ.get(name, "")
        if value.isdigit():
            return value
    return ""


def register():
    directory = os.environ.get(_DIR_ENV)
    if not directory or not hasattr(__import__("signal"), "SIGRTMIN"):
        return
    pid = os.getpid()
    owner = os.environ.get(_OWNER_ENV)
    if owner and owner != str(pid) and owner == str(os.getppid()):
        os.environ[_OWNER_ENV] = str(pid)  # so this process's own children stay out too
        return
    import faulthandler
    import signal
    import threading

    signum = signal.SIGRTMIN + _SIGNAL_OFFSET
    path = os.path.join(directory, "%d.stacks" % pid)
    dump = open(path, "w")
    fields = {
        "pid": pid,
        "ppid": os.getppid(),
        "start": _start_time(),
        "signal": int(signum),
        "main": "0x%016x" % threading.main_thread().ident,
        "rank": _first("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "JAX_PROCESS_ID", "DMLC_TASK_ID"),
        "local_rank": _first("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"),
    }
    dump.write("# trainer-launcher stacks " + " ".join("%s=%s" % item for item in fields.items()) + "\n")
    dump.flush()
    faulthandler.register(signum, file=dump, all_threads=True, chain=False)
    os.environ[_OWNER_ENV] = str(pid)


try:
    register()
except Exception:
    pass  # no stacks for this process is better than a program that does not start
