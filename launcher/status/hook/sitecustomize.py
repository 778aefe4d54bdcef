"""Run by every Python interpreter a rank starts (this directory is first on PYTHONPATH only when
hang detection is on): make the process dump all its threads' Python stacks to a per-process file
when the launcher sends it a real-time signal.

faulthandler dumps from a C signal handler, so a rank blocked in a collective (no GIL held, no
Python signal handler able to run) still answers, and no ptrace is needed. A real-time signal
leaves SIGUSR1/SIGUSR2, which programs and schedulers use, alone.

The registration itself is _trainer_launcher_stacks.py, beside this file. This file runs inside
the user's program: stdlib only, Python 3.8 syntax, silent, and it never raises. Afterwards it runs the sitecustomize this one hides (Debian's and Ubuntu's Pythons ship
one), as if this directory were not on the path.
"""

import os
import sys
import contextlib


def _chain():
    """Import the sitecustomize that would have run without this directory on the path."""
    here = os.path.dirname(os.path.abspath(__file__))
    mine = sys.modules.get(__name__)
    saved = list(sys.path)
    sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != here]
    try:
        del sys.modules[__name__]
        import sitecustomize  # noqa: F401  (the next one on the path, if any)
    except ImportError as error:
        if getattr(error, "name", None) != "sitecustomize":
            _note("the next sitecustomize failed: %r" % (error,))
        if mine is not None:
            sys.modules[__name__] = mine
    except Exception as error:  # theirs failed: site.py would have said so and gone on
        _note("the next sitecustomize failed: %r" % (error,))
    finally:
        sys.path[:] = saved


def _note(text):
    """The chained module's own failure, said the way site.py says it (to stderr, once)."""
    with contextlib.suppress(Exception):
        sys.stderr.write("Error in sitecustomize; set PYTHONVERBOSE for traceback:\n%s\n" % text)


try:
    import _trainer_launcher_stacks  # noqa: F401  (registers on import; the name is ours alone)
except Exception:
    pass  # no stacks for this process is better than a program that does not start
_chain()
