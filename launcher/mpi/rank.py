"""``python -m launcher.mpi.rank PROGRAM [ARGS]``: how a Python rank runs under ``trainer-launcher mpi``.

It runs the program as ``python -m mpi4py`` does (an uncaught exception or a non-zero
``sys.exit`` in one rank calls MPI_Abort, so the others stop waiting), and before that abort it
tells the launcher which rank failed, on which host, and why: one JSON line over TCP to the
address in ``TRAINER_LAUNCHER_RANK_REPORT``, answered before the abort goes out. mpirun's own
"rank N aborted" line travels through the MPI's output forwarding, which the abort itself races
and sometimes loses; this report does not. A program whose MPI came up without mpi4py (MLX's MPI
backend loads libmpi itself) is aborted the same way, through that library.

Imports nothing from the launcher beyond this file, and mpi4py only when the program starts: it
runs in every rank, so it reads its few variables from the environment itself rather than through
launcher.core.settings (and pydantic).
"""

from __future__ import annotations

import json
import os
import socket
import sys

# "<address>/<port>/<token>", set by the launcher. No spaces: hydra passes the environment to
# remote ranks through a shell command line.
REPORT_ENV = "TRAINER_LAUNCHER_RANK_REPORT"
MODULE = "launcher.mpi.rank"
REPORT_TIMEOUT = 2.0  # seconds a failing rank may spend telling the launcher before it aborts
ERROR_LIMIT = 1000

# Where each MPI puts a rank's place in the job.
_RANK = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
_LOCAL_RANK = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")


def exit_status(exc: BaseException) -> int:
    """The status ``python -m mpi4py`` aborts with for this exception (0: no abort)."""
    if isinstance(exc, SystemExit):
        code = exc.code
        if code is None:
            return 0
        return code if isinstance(code, int) else 1
    return 1


def describe(exc: BaseException) -> str | None:
    """What went wrong, in a line: the exception, or a non-integer sys.exit message."""
    if isinstance(exc, SystemExit):
        return None if exc.code is None or isinstance(exc.code, int) else str(exc.code)[:ERROR_LIMIT]
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text[:ERROR_LIMIT]


def _first_int(names: tuple[str, ...]) -> int | None:
    for name in names:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def report(status: int, error: str | None, target: str | None = None) -> bool:
    """Send this rank's failure to the launcher; True once the launcher has it."""
    target = os.environ.get(REPORT_ENV, "") if target is None else target
    parts = target.split("/")
    if len(parts) != 3 or not parts[1].isdigit():
        return False
    address, port, token = parts[0], int(parts[1]), parts[2]
    line = json.dumps({
        "token": token,
        "rank": _first_int(_RANK),
        "localRank": _first_int(_LOCAL_RANK),
        "host": socket.gethostname(),
        "exitCode": status,
        "error": error,
    }) + "\n"
    try:
        with socket.create_connection((address, port), timeout=REPORT_TIMEOUT) as connection:
            connection.sendall(line.encode())
            return connection.recv(16).startswith(b"ok")
    except OSError:
        return False  # the launcher is gone or unreachable: the abort still goes out


def native_mpi() -> str | None:
    """The libmpi that a library other than mpi4py (MLX dlopens its own) initialized in this
    process and has not finalized; None when there is none."""
    import ctypes

    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            paths = sorted({line.split()[-1] for line in maps if "/libmpi.so" in line})
    except OSError:
        return None
    for path in paths:
        started, ended = ctypes.c_int(0), ctypes.c_int(0)
        try:
            library = ctypes.CDLL(path, mode=os.RTLD_NOLOAD)  # only one already loaded
            asked = (library.MPI_Initialized(ctypes.byref(started)), library.MPI_Finalized(ctypes.byref(ended)))
        except (OSError, AttributeError):  # gone, or not an MPI library after all
            continue
        if asked == (0, 0) and started.value and not ended.value:
            return path
    return None


def abort_through(path: str, status: int, exc: BaseException) -> None:
    """Say what Python would say about ``exc``, then MPI_Abort on the library at ``path``.

    Left to exit, such a rank finalizes MPI from the library's own teardown (MLX: its group's
    destructor), and MPI_Finalize waits for every rank, while the others wait for this one in
    their next collective: the job hangs. mpi4py's armed abort does not fire for an MPI it did not
    start, so abort here, through mpi4py bound to that same, already initialized, library."""
    os.environ["MPI4PY_LIBMPI"] = path  # read when mpi4py.MPI loads: the library already up
    try:
        from mpi4py import MPI
    except Exception:  # noqa: BLE001 - an MPI mpi4py cannot bind: leave the exit as it was
        return
    if isinstance(exc, SystemExit):
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    else:
        sys.excepthook(type(exc), exc, exc.__traceback__)
    sys.stdout.flush()
    sys.stderr.flush()
    MPI.COMM_WORLD.Abort(status)


def unsupported_mpi4py() -> str | None:
    """This rank's mpi4py outside the supported range (launcher.core.versions), as one line."""
    from launcher.core import versions

    line = versions.refusal("mpi4py")
    if line is None or versions.allowed(os.environ.get(versions.ALLOW_ENV)):
        return None
    return line


def main() -> None:
    if line := unsupported_mpi4py():
        print(f"trainer-launcher: error: {line}", file=sys.stderr, flush=True)
        report(2, line)
        sys.exit(2)
    from mpi4py import run

    try:
        run.main()  # parses sys.argv like `python -m mpi4py`, arms MPI_Abort for a failure
    except KeyboardInterrupt:
        raise  # the MPI tearing the job down for someone else's failure: not ours to report
    except BaseException as exc:
        if status := exit_status(exc):
            report(status, describe(exc))
            if "mpi4py.MPI" not in sys.modules and (path := native_mpi()):
                abort_through(path, status, exc)
        raise


if __name__ == "__main__":
    main()
