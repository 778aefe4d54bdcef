"""``python -m launcher.mpi.rank PROGRAM [ARGS]``: how a Python rank runs under ``trainer-launcher mpi``.

It runs the program exactly as ``python`` would (launcher/runner/program.py, the runner every
framework shares), and, as ``python -m mpi4py`` does, an uncaught exception or a non-zero exit in
one rank calls MPI_Abort, so the others stop waiting. Before that abort it tells the launcher
which rank failed, on which node, and why: the launcher's one report (launcher/runner/report.py:
ending ``failed``, or ``refused`` for an mpi4py out of range) as one JSON line over TCP to the
address in ``TRAINER_LAUNCHER_RANK_REPORT``, the token beside it, answered before the abort goes
out. mpirun's own "rank N aborted" line travels through the MPI's output forwarding, which the
abort itself races and sometimes loses; this report does not. A program whose MPI came up
without mpi4py (MLX's MPI backend loads libmpi itself) is aborted the same way, through that
library.

Imports nothing of the launcher but stdlib-only modules (the runner, the version table), and
mpi4py only when the program starts: it runs in every rank, so it reads its few variables from the
environment itself rather than through launcher.core.settings (and pydantic).
"""

from __future__ import annotations

import json
import os
import socket
import sys

from launcher.mpi import watch
from launcher.runner import program
from launcher.runner import report as records

# "<address>/<port>/<token>", set by the launcher. No spaces: hydra passes the environment to
# remote ranks through a shell command line.
REPORT_ENV = "TRAINER_LAUNCHER_RANK_REPORT"
MODULE = "launcher.mpi.rank"
REPORT_TIMEOUT = 2.0  # seconds a failing rank may spend telling the launcher before it aborts

# Where each MPI puts a rank's place in the job.
_RANK = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
_LOCAL_RANK = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")


def _first_int(names: tuple[str, ...]) -> int | None:
    for name in names:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def report(
    status: int | None, error: str | None, target: str | None = None, ending: str = "failed", **fields: str
) -> bool:
    """Send this rank's report (``ending``, its exit ``status``, ``error``, and ``fields`` such as
    a refusal's ``reason``) to the launcher; True once the launcher has it."""
    target = os.environ.get(REPORT_ENV, "") if target is None else target
    parts = target.split("/")
    if len(parts) != 3 or not parts[1].isdigit():
        return False
    address, port, token = parts[0], int(parts[1]), parts[2]
    said = records.report(
        ending,
        status,
        rank=_first_int(_RANK),
        local_rank=_first_int(_LOCAL_RANK),
        node=socket.gethostname(),
        error=error,
        **fields,
    )
    line = json.dumps({"token": token, **said}) + "\n"  # the token is the transport's, beside the report
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


def abort_through(path: str, status: int) -> None:
    """MPI_Abort on the library at ``path``, after what the program printed.

    Left to exit, such a rank finalizes MPI from the library's own teardown (MLX: its group's
    destructor), and MPI_Finalize waits for every rank, while the others wait for this one in
    their next collective: the job hangs. mpi4py's armed abort does not fire for an MPI it did not
    start, so abort here, through mpi4py bound to that same, already initialized, library."""
    os.environ["MPI4PY_LIBMPI"] = path  # read when mpi4py.MPI loads: the library already up
    try:
        from mpi4py import MPI
    except Exception:  # noqa: BLE001 - an MPI mpi4py cannot bind: leave the exit as it was
        return
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


def abort_on_exit(status: int) -> None:
    """End the whole job when this rank exits ``status``, as ``python -m mpi4py`` does: through
    mpi4py's abort at exit when the program started MPI with it, else through the library another
    binding started (``native_mpi``)."""
    if "mpi4py.MPI" in sys.modules:
        from mpi4py.run import set_abort_status

        set_abort_status(status)
    elif path := native_mpi():
        abort_through(path, status)


def main() -> None:
    if line := unsupported_mpi4py():
        from launcher.core.reasons import Reasons

        refused = Reasons.UNSUPPORTED_VERSION
        print(f"trainer-launcher: error: {line}", file=sys.stderr, flush=True)
        report(refused.exit_code(), line, ending="refused", reason=refused)
        sys.exit(refused.exit_code())
    try:
        kind, target, args = program.parse_target(sys.argv[1:])
    except ValueError as usage:
        print(f"trainer-launcher: error: {usage}", file=sys.stderr, flush=True)
        sys.exit(2)
    if os.environ.get(REPORT_ENV):  # a launcher to tell of a signal that ends the rank
        watch.split(lambda name: report(None, None, signal=name))
    program.set_sys_path(kind, target, os.getcwd())  # python -m put the working directory there
    ending = program.run_program(kind, target, args)
    if ending.status and not ending.interrupted:  # interrupted: the MPI tearing the job down for another's failure
        report(ending.status, program.describe(ending.error))
    if ending.status:
        abort_on_exit(ending.status)
    program.exit_as_python(ending)


if __name__ == "__main__":
    main()
