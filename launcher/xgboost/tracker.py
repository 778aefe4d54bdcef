"""``python tracker.py --workers N --port P [--host H] [--ready-fd FD]``: the job's RabitTracker,
run by ``trainer-launcher xgboost`` on pod 0.

It listens on ``H:P`` (all addresses by default) for N workers, assigning ranks by task id (the
workers' runner pads the ids, so rank == task id), says ``ready`` on the pipe ``--ready-fd`` (no
probe connection needed), and exits 0 once every worker has shut its collective down. It has no
timeout of its own: xgboost's applies to every gap between two tracker events, training included;
the launcher bounds the wait for workers instead.

Started by the launcher before it has planned (``--go-fd FD`` instead of N, P and H), it leaves at
once on any pod but 0, and on pod 0 imports xgboost while the launcher validates, then takes N, P
and H from the launcher's go word (one JSON line), or leaves silently if the pipe closes first.

The other pods' launchers know the tracker is up when its port accepts a connection, which they
close at once; xgboost logs each such connection as a failed worker handshake ("Failed to
initialize worker proxy", "Connection reset by peer"), which reads like a fault. Those warnings
are dropped from the tracker's stderr; everything else passes through.

xgboost 2.1.x's RabitTracker binds a port the OS chooses whatever ``port`` says (fixed in 3.0):
launcher/xgboost/compat.py (``tracker_on_port``) puts a socket on the port asked for in its place.

Run by path, like run.py: the standard library and xgboost only (and run.py's stdlib compat.py).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import threading
from collections.abc import Callable
from typing import NoReturn

# The first line of xgboost's warning for a connection that closed before its handshake; the
# lines after it that start with "- [" are its causes.
_PROBE_WARNING = re.compile(r"WARNING: .*Failed to initialize worker proxy")
CANNOT_IMPORT = "cannot import xgboost"  # its one line when the program's python has none (exit 2)

if __package__:
    from launcher.xgboost.run import compat, error_line
else:  # run by path: this file's directory is sys.path[0]
    from run import compat, error_line  # type: ignore[import-not-found,no-redef]


SAYS = "trainer-launcher: xgboost tracker: "  # what each of its own lines begins with


def _say(message: str) -> None:
    print(f"{SAYS}{message}", file=sys.stderr, flush=True)


def without_probe_warnings() -> Callable[[], None]:
    """Route fd 2 (xgboost's native log) through a filter thread; return what flushes it."""
    original = os.dup(2)
    read_fd, write_fd = os.pipe()
    os.dup2(write_fd, 2)
    os.close(write_fd)

    def pump() -> None:
        skipping = False
        with os.fdopen(read_fd, "rb") as source, os.fdopen(original, "wb", buffering=0) as target:
            for line in source:
                text = line.decode("utf-8", "replace")
                if _PROBE_WARNING.search(text):
                    skipping = True
                elif not (skipping and text.startswith("- [")):
                    skipping = False
                    target.write(line)

    thread = threading.Thread(target=pump, name="stderr-filter", daemon=True)
    thread.start()

    def finish() -> None:
        sys.stderr.flush()
        os.close(2)  # the pipe's last write end: the filter reads to its end and stops
        thread.join(timeout=5)

    return finish


_finish_stderr: Callable[[], None] = lambda: None  # noqa: E731


def _leave(status: int) -> NoReturn:
    """Exit without the tracker's destructor, which raises again what already failed."""
    sys.stdout.flush()
    _finish_stderr()
    os._exit(status)


def _go_word(fd: int) -> dict | None:
    """The launcher's one JSON line with the tracker's arguments; None if it closed the pipe without one."""
    with os.fdopen(fd, "rb") as pipe:
        line = pipe.readline()
    return json.loads(line) if line.endswith(b"\n") else None


def is_pod_0() -> bool:
    """Only pod 0 runs the tracker: the launcher starts the early tracker there alone, and a
    tracker started elsewhere leaves before the slow import. (The launcher validates these
    variables.)"""
    index = (os.environ.get("DMLC_TASK_ID") or os.environ.get("JOB_COMPLETION_INDEX") or "0").strip()
    return not index.isdigit() or int(index) == 0  # unreadable: the launcher will say so


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="tracker.py", description="the job's RabitTracker")
    parser.add_argument("--workers", type=int)
    parser.add_argument("--port", type=int)
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument(
        "--go-fd", type=int, help="take --workers/--port/--host from the launcher's go word on this pipe"
    )
    parser.add_argument("--ready-fd", type=int, help="say `ready` on this pipe once listening")
    args = parser.parse_args(argv)
    if args.go_fd is None and (args.workers is None or args.port is None):
        parser.error("--workers and --port are required without --go-fd")
    if args.go_fd is not None and not is_pod_0():
        sys.exit(0)
    global _finish_stderr
    _finish_stderr = without_probe_warnings()

    try:
        from xgboost.tracker import RabitTracker
    except Exception as error:  # noqa: BLE001 - not installed in this interpreter, or a broken install
        _say(f"{sys.executable} {CANNOT_IMPORT}: {type(error).__name__}: {error}")
        _leave(2)  # the image's fault, as for the workers (run.py): the launcher reads it as a ConfigError

    if args.go_fd is not None:
        word = _go_word(args.go_fd)
        if word is None:
            _leave(0)  # the launcher stopped first, or planned no tracker here
        args.workers, args.port, args.host = int(word["workers"]), int(word["port"]), str(word["host"])
    try:
        # On xgboost 2.1.x, RabitTracker ignores `port`: compat moves its socket onto it.
        tracker = compat.tracker_on_port(RabitTracker, args.workers, args.host, args.port, sortby="task")
        tracker.start()
    except Exception as error:  # noqa: BLE001 - XGBoostError: the port is taken, the address is not ours
        _say(f"could not listen on {args.host}:{args.port}: {error_line(error)}")
        _leave(1)
    _say(f"listening on {args.host}:{args.port} for {args.workers} workers")
    if args.ready_fd is not None:
        try:
            os.write(args.ready_fd, b"ready\n")
            os.close(args.ready_fd)
        except OSError:
            pass  # the launcher is gone; we die with it
    try:
        tracker.wait_for()
    except Exception as error:  # noqa: BLE001
        _say(f"failed: {error_line(error)}")
        _leave(1)
    _say(f"all {args.workers} workers finished")
    _leave(0)


if __name__ == "__main__":
    main()
