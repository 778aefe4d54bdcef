"""The MPI rank's watcher: ``launcher.mpi.rank`` forks before the program starts. The child runs
the program; the parent, the process mpirun started, waits for it and tells the launcher of a
signal that ended it.

A rank a signal ends (the OOM killer's SIGKILL, a segfault) cannot say so itself, and across pods
the MPIs' own words for it race their teardown: MPICH's mpiexec exits 255 on its other proxy's
error, Open MPI 5 names the abort of a peer that lost the socket (exit 14). Both verdicts were
permanent. The watcher reads the signal from the child's status, reports it (ending ``failed``,
``signal``) before ending the same way itself, so mpirun says what it said before and the judge
has the report first.

Only a signal the watcher never passes on is reported: a SIGKILL, a fault. One it passes on
(mpirun stopping its ranks for another's failure, a SIGTERM from the pod, a KeyboardInterrupt) is
a teardown, not the rank's own end. The rank dies with its watcher (PR_SET_PDEATHSIG), so
mpirun's SIGKILL of the watcher still ends it, without a report.

Standard library only: it runs in every rank, in the user's interpreter.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable
from typing import NoReturn

# What mpirun and the pod send a rank, passed on to the program: stop, interrupt, the user's own
# signals, stop and continue.
PASSED_ON = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGCONT", "SIGTSTP")
_PR_SET_PDEATHSIG = 1


def split(tell: Callable[[str], object]) -> None:
    """Fork. Returns in the child, which goes on to run the program; the parent watches it and
    never returns: it ``tell``\\ s the name of a signal that ended the child on its own, then ends
    as the child did. The stack dump registered at the interpreter's start moves to the child."""
    hook = sys.modules.get("_trainer_launcher_stacks")  # registered by the hang watch's sitecustomize
    if hook is not None:
        hook.withdraw()
    sys.stdout.flush()
    sys.stderr.flush()
    parent = os.getpid()
    child = os.fork()
    if child == 0:
        _die_with(parent)
        if hook is not None:
            hook.register()
        return
    _watch(child, tell)


def _die_with(parent: int) -> None:
    import ctypes

    try:
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the rank outlives a SIGKILLed watcher there
        return
    if os.getppid() != parent:  # the watcher was gone before the request: end as it would have
        os.kill(os.getpid(), signal.SIGKILL)


def _watch(child: int, tell: Callable[[str], object]) -> NoReturn:
    def pass_on(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signum)

    for name in PASSED_ON:
        signal.signal(getattr(signal, name), pass_on)
    _, status = os.waitpid(child, 0)
    if not os.WIFSIGNALED(status):
        os._exit(os.WEXITSTATUS(status))
    signum = os.WTERMSIG(status)
    ended = _name(signum)
    if ended is not None and ended not in PASSED_ON:
        tell(ended)
    _end_by(signum)


def _name(signum: int) -> str | None:
    try:
        return signal.Signals(signum).name
    except ValueError:  # a real-time signal: no name the judge knows; mpirun's code says it
        return None


def _end_by(signum: int) -> NoReturn:
    """End by ``signum``, as the rank did, without a core file of the watcher."""
    import resource

    with contextlib.suppress(OSError, ValueError):
        resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    if signum not in (signal.SIGKILL, signal.SIGSTOP):  # theirs cannot be changed
        signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)  # a signal whose default is not to end the process
