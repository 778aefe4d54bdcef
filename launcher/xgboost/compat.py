"""xgboost beyond its documented API, each use behind a feature check: the one place the XGBoost
runner (run.py) and tracker (tracker.py) reach into xgboost's internals.

Both run in the user's interpreter, by path, so this module is the standard library only, never
imports xgboost (its callers pass the modules they imported) and is loaded by path as well
(``run.load_sibling``, under a name of its own: a program may have a ``compat`` module). Verified
on xgboost 2.1.1, 2.1.4 and 3.2.0 (tests/test_matrix_xgboost.py runs 2.1.4 and 3.2.0).

| hook             | relies on                                          | without it                              |
| tracker_on_port  | the tracker's listening socket, found among this   | (needed on 2.1.x only) the tracker      |
|                  | process's descriptors (/proc/self/fd): on 2.1.x it | listens where 2.1.x put it and the      |
|                  | is on a port the OS chose, and a socket on the     | other pods' workers cannot join; said   |
|                  | port asked for takes its descriptor (dup2)         | once                                    |
| join_collective  | ``collective.init``/``finalize``, which            | the program's own CommunicatorContext() |
|                  | ``CommunicatorContext.__enter__``/``__exit__``     | builds a second collective (xgboost 3   |
|                  | call through the module's globals                  | refuses); direct init() calls still join|
| stand_in_tracker | ``RabitTracker.__init__``'s ``n_workers`` and      | a program's RabitTracker on             |
|                  | ``port`` (2.1 takes them positionally, 3.x takes   | DMLC_TRACKER_PORT binds that port       |
|                  | ``sortby`` by keyword only); ``free()`` (internal, | itself and fails: the launcher's        |
|                  | called by ``__del__``)                             | tracker holds it                        |
"""

from __future__ import annotations

import errno
import fcntl
import inspect
import os
import socket
import stat
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING or __package__:  # imported as the launcher's package (and as a type checker reads it)
    from launcher.core import versions
else:  # loaded by path, as the runner beside it is: the launcher's files through the one loader
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "runner"))
    from _trainer_launcher_load import program

    del sys.path[0]
    versions = program.core("versions")

notes = versions.FeatureNotes("xgboost")  # each said once
feature_off = notes.off


def xgboost_version() -> str:
    return versions.running("xgboost")


# --- the tracker's port ----------------------------------------------------------------------------


def _listening() -> dict[int, tuple[int, int]] | None:
    """This process's listening TCP sockets, ``{fd: (family, port)}``; None without /proc/self/fd."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd") if name.isdigit()]
    except OSError:
        return None
    found: dict[int, tuple[int, int]] = {}
    for fd in fds:
        try:
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            probe = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue  # the listing's own descriptor, or one closed meanwhile
        with probe:
            try:
                if (
                    probe.family in (socket.AF_INET, socket.AF_INET6)
                    and probe.type == socket.SOCK_STREAM
                    and probe.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
                ):
                    found[fd] = (probe.family, probe.getsockname()[1])
            except OSError:
                continue
    return found


def tracker_on_port(tracker_class, n_workers: int, host: str, port: int, **kwargs):
    """``tracker_class(n_workers=, host_ip=, port=, **kwargs)``, listening on ``port``.

    xgboost 2.1.x's tracker binds its listener to port 0 whatever ``port`` says (its
    ``TCPSocket::Bind`` ignores the port; dmlc/xgboost#10973 fixed it in 3.0) and tells its workers
    the port the OS chose through ``worker_args()``. The launcher's workers on other pods only
    know DMLC_TRACKER_PORT, so here the socket xgboost created is found by its port and a socket
    listening on ``port`` takes its descriptor (dup2) before ``start()``: the tracker then accepts
    on ``port``, with each worker's real address, as 3.x does. Verified on 2.1.1 and 2.1.4; on 3.x
    the socket is already on ``port`` and nothing is done. ``OSError``: ``port`` is taken (as 3.x
    says it, in its own words); RuntimeError: the socket cannot be found or moved."""
    before = _listening() if port else {}
    tracker = tracker_class(n_workers=n_workers, host_ip=host, port=port, **kwargs)
    if not port:
        return tracker
    after = _listening()
    if before is None or after is None:
        # No /proc: nothing to check or move. Right on 3.x; 2.1.x's workers then never join.
        feature_off(
            "moving the tracker onto DMLC_TRACKER_PORT",
            "this system has no /proc/self/fd to find its "
            "socket in (xgboost 2.1.x listens on a port of its own choosing)",
        )
        return tracker
    new = {fd: found for fd, found in after.items() if before.get(fd) != found}
    if any(found_port == port for _, found_port in new.values()):
        return tracker  # xgboost 3.x: the port asked for
    if len(new) != 1:
        raise RuntimeError(
            f"xgboost {xgboost_version()}'s RabitTracker does not listen on port {port} "
            f"(listening: {sorted(p for _, p in new.values()) or 'nowhere'}) and its socket cannot "
            "be told apart; use xgboost 3.0 or later"
        )
    ((fd, (family, _)),) = new.items()
    _move_listener(fd, family, host, port, max(n_workers, 128))
    return tracker


def _move_listener(fd: int, family: int, host: str, port: int, backlog: int) -> None:
    """Put a socket listening on ``host:port`` where descriptor ``fd`` is, keeping its flags."""
    replacement = socket.socket(family, socket.SOCK_STREAM)
    try:
        replacement.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            with socket.socket(fileno=os.dup(fd)) as old:
                replacement.setsockopt(
                    socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, old.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY)
                )
        replacement.bind((host, port))
        replacement.listen(backlog)
        status_flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fd_flags = fcntl.fcntl(fd, fcntl.F_GETFD)
        os.dup2(replacement.fileno(), fd)  # closes xgboost's socket on the OS's port
        fcntl.fcntl(fd, fcntl.F_SETFL, status_flags)
        fcntl.fcntl(fd, fcntl.F_SETFD, fd_flags)
    except OSError as error:
        if error.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES):
            raise OSError(error.errno, f"Failed to bind socket: {error.strerror}") from None
        raise
    finally:
        replacement.close()


# --- the program's own collective calls ------------------------------------------------------------


def _calls_through_module(function, module, name: str) -> bool:
    code = getattr(function, "__code__", None)
    return code is not None and getattr(function, "__globals__", None) is vars(module) and name in code.co_names


def join_collective(collective, init, finalize):
    """Replace ``collective.init`` and ``collective.finalize`` while the program runs; return what
    puts the real ones back. ``CommunicatorContext`` enters and leaves by calling the module's
    ``init``/``finalize`` through its globals (2.1.1 to 3.2.0), so a program's own context joins
    too; where it does not, that part is off and said once."""
    real = {name: getattr(collective, name, None) for name in ("init", "finalize")}
    if not all(callable(function) for function in real.values()):
        feature_off(
            "joining the program's own collective.init() and CommunicatorContext()",
            "xgboost.collective has no init()/finalize() to stand in for; the program's own set-up "
            "builds a collective of its own (LAUNCHER_XGBOOST_TRACKER=program runs the collective yourself)",
        )
        return lambda: None
    context = getattr(collective, "CommunicatorContext", None)
    if not (
        _calls_through_module(getattr(context, "__enter__", None), collective, "init")
        and _calls_through_module(getattr(context, "__exit__", None), collective, "finalize")
    ):
        feature_off(
            "joining the program's own CommunicatorContext()",
            "its __enter__/__exit__ do not call collective.init()/finalize(); the program's context builds a "
            "collective of its own (LAUNCHER_XGBOOST_TRACKER=program runs the collective yourself)",
        )
    collective.init, collective.finalize = init, finalize

    def restore() -> None:
        collective.init, collective.finalize = real["init"], real["finalize"]

    return restore


# --- the program's own RabitTracker ----------------------------------------------------------------


def stand_in_tracker(package, tracker_module, port: int, num_worker: int, worker_args):
    """While the program runs, a ``RabitTracker`` it creates on ``port`` (DMLC_TRACKER_PORT) stands
    for the tracker the launcher runs on pod 0: ``start``/``wait_for``/``free`` do nothing and
    ``worker_args()`` is ``worker_args()``; on any other port it is the real one. Return what puts
    the real class back."""
    real: Any = getattr(tracker_module, "RabitTracker", None)  # xgboost's class, or None
    try:
        signature = inspect.signature(real.__init__)
    except (TypeError, ValueError, AttributeError):
        signature = None
    if real is None or signature is None or not {"n_workers", "port"} <= set(signature.parameters):
        feature_off(
            "standing in for the program's RabitTracker on DMLC_TRACKER_PORT",
            "xgboost.tracker.RabitTracker(n_workers=, port=) is not there; a tracker the program starts "
            "binds that port itself (LAUNCHER_XGBOOST_TRACKER=program runs the tracker yourself)",
        )
        return lambda: None
    bind = signature.bind

    class JobTracker(real):
        """The program's RabitTracker: on DMLC_TRACKER_PORT, the launcher's tracker on pod 0;
        on any other port, a tracker of the program's own."""

        def __init__(self, *args, **kwargs):
            bound = bind(self, *args, **kwargs)
            bound.apply_defaults()
            asked = bound.arguments.get("port") or 0
            self._launchers = str(asked).strip().isdigit() and int(asked) == port
            if not self._launchers:
                super().__init__(*args, **kwargs)
                return
            n_workers: Any = bound.arguments.get("n_workers")  # the program's, whatever it passed
            if not str(n_workers).strip().isdigit() or int(n_workers) != num_worker:
                raise ValueError(
                    f"RabitTracker(n_workers={n_workers!r}) on port {asked}: the launcher's tracker "
                    f"there expects DMLC_NUM_WORKER={num_worker} workers"
                )

        def start(self, *args, **kwargs) -> None:
            if not self._launchers:
                super().start(*args, **kwargs)

        def wait_for(self, *args, **kwargs) -> None:
            if not self._launchers:
                super().wait_for(*args, **kwargs)

        def worker_args(self) -> dict:
            return worker_args() if self._launchers else super().worker_args()

        def free(self) -> None:
            # Internal ("for testing"), called by __del__: the stand-in holds no native tracker.
            if not getattr(self, "_launchers", False) and callable(getattr(super(), "free", None)):
                super().free()

    JobTracker.__name__ = JobTracker.__qualname__ = real.__name__
    JobTracker.__module__ = real.__module__
    homes = [module for module in (tracker_module, package) if getattr(module, "RabitTracker", None) is real]
    for module in homes:
        module.RabitTracker = JobTracker

    def restore() -> None:
        for module in homes:
            module.RabitTracker = real

    return restore
