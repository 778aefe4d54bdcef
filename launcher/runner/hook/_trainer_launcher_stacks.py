"""Registers this process's stack dump (see sitecustomize.py beside it), once, on import.

Two ways, one per process: where the launcher's stacks directory is on this machine, a file and a
real-time signal the launcher sends (launcher/status/stacks.py); where it is not (a rank on a
worker pod that mpirun reached, which the launcher cannot signal), a connection to the launcher's
stack board, which a thread of this process answers with the same dump (launcher/status/board.py).

Imported by the sitecustomize beside it at interpreter start, and by a framework's runner (its
``run.py``, in the user's interpreter) that started before the hook was on its PYTHONPATH, once
the launcher's variables have reached it. Standard library only, Python 3.8 syntax, never raises.
"""

import os

_DIR_ENV = "LAUNCHER_STACKS_DIR"
_BOARD_ENV = "TRAINER_LAUNCHER_STACKS_BOARD"
# Set in a registered process's environment: Python processes it starts (spawned data-loader or
# compile workers) see their parent's pid there and stay out, so each rank has one dump file.
_OWNER_ENV = "LAUNCHER_STACKS_OWNER"
_SIGNAL_OFFSET = 5  # SIGRTMIN + 5: clear of the first few real-time signals that libraries take
# What register() set up in this process, for withdraw(): "dump" (the file and its signal) or
# "board" (the answering thread and its state).
_registered = {}  # type: dict


def _start_time():
    """The process's start time in clock ticks (/proc/self/stat field 22): with the pid, it tells
    the launcher that a pid still names this process and was not reused."""
    with open("/proc/self/stat", "rb") as handle:
        stat = handle.read()
    return int(stat[stat.rindex(b")") + 2 :].split()[19])


def _first(*names):
    for name in names:
        value = os.environ.get(name, "")
        if value.isdigit():
            return value
    return ""


def register():
    directory = os.environ.get(_DIR_ENV)
    board = os.environ.get(_BOARD_ENV)
    if not (directory and os.path.isdir(directory)) and not board:
        return
    pid = os.getpid()
    owner = os.environ.get(_OWNER_ENV)
    if owner and owner != str(pid) and owner == str(os.getppid()):
        os.environ[_OWNER_ENV] = str(pid)  # so this process's own children stay out too
        return
    import threading

    fields = {
        "pid": pid,
        "ppid": os.getppid(),
        "main": f"0x{threading.main_thread().ident:016x}",
        "rank": _first("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "JAX_PROCESS_ID", "DMLC_TASK_ID"),
        "local_rank": _first("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"),
    }
    if directory and os.path.isdir(directory):
        _register_signal(directory, fields)
    else:
        import atexit
        import json
        import socket

        state = {"pid": pid}
        thread = threading.Thread(
            target=_answer_board, args=(board, fields, state, json, socket), name="trainer-launcher-stacks"
        )
        thread.daemon = True
        thread.start()
        atexit.register(_stop_answering, thread, state, socket)
        _registered["board"] = (thread, state, socket)
    os.environ[_OWNER_ENV] = str(pid)


def withdraw():
    """Undo register() in this process, which will not run the program after all: a rank's
    watcher forks, and its child, which runs the program, registers anew (the owner variable
    cleared). Its dump file is removed, its board connection closed, before the fork: no thread
    is left running across it. Never raises. Nothing to undo where it did not register (a
    process of a registered one's, which stays out, and its children with it)."""
    if not _registered:
        return
    try:
        if "dump" in _registered:
            import faulthandler

            dump, signum = _registered.pop("dump")
            faulthandler.unregister(signum)
            os.remove(dump.name)
            dump.close()
        if "board" in _registered:
            thread, state, socket = _registered.pop("board")
            _stop_answering(thread, state, socket)
            if state.get("connection") is not None:
                state["connection"].close()
    except Exception:  # noqa: BLE001 - no stacks for this process is better than a failing rank
        pass
    os.environ.pop(_OWNER_ENV, None)


def _register_signal(directory, fields):
    import faulthandler
    import signal

    if not hasattr(signal, "SIGRTMIN"):
        return
    signum = signal.SIGRTMIN + _SIGNAL_OFFSET
    fields = dict(fields, start=_start_time(), signal=int(signum))
    # Open for the life of the process: faulthandler writes each dump to it from a signal handler.
    dump = open(os.path.join(directory, f"{fields['pid']}.stacks"), "w")  # noqa: SIM115
    dump.write("# trainer-launcher stacks " + " ".join(f"{key}={value}" for key, value in fields.items()) + "\n")
    dump.flush()
    faulthandler.register(signum, file=dump, all_threads=True, chain=False)
    _registered["dump"] = (dump, signum)


def _stop_answering(thread, state, socket):
    """At exit, before the interpreter finalizes: end the thread while it is still safe to. A
    daemon thread that wakes up during finalization (its connect refused, its recv ended) crashed
    it: SIGSEGV or "malloc_consolidate(): unaligned fastbin chunk detected", 3 exits of a
    one-line program in 300 under load, so a rank that had succeeded failed. Waits at most 2 s,
    for a connect still under way to a board that does not answer. A forked child that exits
    through its exit handlers leaves its parent's connection alone."""
    if os.getpid() != state["pid"]:
        return
    state["stop"] = True
    connection = state.get("connection")
    if connection is not None:
        try:  # noqa: SIM105 - no contextlib: this file imports nothing more into the user's program
            connection.shutdown(socket.SHUT_RDWR)  # its recv returns: the thread leaves
        except OSError:
            pass
    thread.join(2.0)


def _answer_board(board, fields, state, json, socket):
    """Say who we are to the launcher's board, then answer each "dump" with our stacks, until the
    launcher closes the connection or this process exits. Silent: no stacks is better than noise
    in the user's output. Its modules come from the main thread: none is imported here at exit."""
    try:
        address, port, token = board.rsplit("/", 2)
        connection = socket.create_connection((address, int(port)), timeout=30)
        state["connection"] = connection
        if state.get("stop"):
            connection.close()
            return
        connection.settimeout(None)
        hello = {"token": token, "pid": fields["pid"], "host": socket.gethostname(), "main": int(fields["main"], 16)}
        for name, key in (("rank", "rank"), ("local_rank", "localRank")):
            if fields[name]:
                hello[key] = int(fields[name])
        connection.sendall(json.dumps(hello).encode() + b"\n")
        received = b""
        while True:
            chunk = connection.recv(256)
            if not chunk:
                return
            received += chunk
            while b"\n" in received:
                line, received = received.split(b"\n", 1)
                if line != b"dump":
                    continue
                import faulthandler  # asked for a dump: the program is running, not ending
                import tempfile

                with tempfile.TemporaryFile() as dump:
                    faulthandler.dump_traceback(file=dump, all_threads=True)
                    dump.seek(0)
                    text = dump.read().decode("utf-8", "replace")
                connection.sendall(json.dumps({"text": text}).encode() + b"\n")
    except Exception:  # noqa: BLE001 - silent: no stacks is better than noise or a crash in the program
        return


try:  # noqa: SIM105 - no contextlib: this file imports nothing more into the user's program
    register()
except Exception:  # noqa: BLE001 - never let the hook stop the user's program
    pass  # no stacks for this process is better than a program that does not start
