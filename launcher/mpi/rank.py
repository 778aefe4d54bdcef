"""``python -m launcher.mpi.rank PROGRAM [ARGS]``: how a Python rank runs under ``trainer-launcher mpi``.

It runs the program as ``python -m mpi4py`` does (an uncaught exception or a non-zero
``sys.exit`` in one rank calls MPI_Abort, so the others stop waiting), and before that abort it
tells the launcher which rank failed, on which host, and why: one JSON line over TCP to the
address in ``TRAINER_LAUNCHER_RANK_REPORT``, answered before the abort goes out. mpirun's own
"rank N aborted" line travels through the MPI's output forwarding, which the abort itself races
and sometimes loses; this report does not.

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


def main() -> None:
    from mpi4py import run

    try:
        run.main()  # parses sys.argv like `python -m mpi4py`, arms MPI_Abort for a failure
    except KeyboardInterrupt:
        raise  # the MPI tearing the job down for someone else's failure: not ours to report
    except BaseException as exc:
        if status := exit_status(exc):
            report(status, describe(exc))
        raise


if __name__ == "__main__":
    main()
