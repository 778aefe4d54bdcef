"""Run by every Python interpreter a rank starts (this directory is first on PYTHONPATH when hang
detection is on, and for the jobs of a framework with hooks of its own): make the process dump all
its threads' Python stacks to a per-process file when the launcher sends it a real-time signal,
and import the modules a framework's ranks also need (their names in TRAINER_LAUNCHER_RANK_HOOKS,
comma-separated, their directory on PYTHONPATH too, in the framework's package).

faulthandler dumps from a C signal handler, so a rank blocked in a collective (no GIL held, no
Python signal handler able to run) still answers, and no ptrace is needed. A real-time signal
leaves SIGUSR1/SIGUSR2, which programs and schedulers use, alone.

The registration itself is _trainer_launcher_stacks.py, beside this file; it does nothing without
the launcher's stacks variables. This file runs inside the user's program: stdlib only, Python
3.8 syntax, silent, and it never raises. Afterwards it runs the sitecustomize this one hides
(Debian's and Ubuntu's Pythons ship one), as if this directory were not on the path.
"""

import os
import sys


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
            _note(f"the next sitecustomize failed: {error!r}")
        if mine is not None:
            sys.modules[__name__] = mine
    except Exception as error:  # noqa: BLE001 - theirs failed: site.py would have said so and gone on
        _note(f"the next sitecustomize failed: {error!r}")
    finally:
        sys.path[:] = saved


def _note(text):
    """The chained module's own failure, said the way site.py says it (to stderr, once)."""
    try:  # noqa: SIM105 - no contextlib: this file imports nothing more into the user's program
        sys.stderr.write(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{text}\n")
    except Exception:  # noqa: BLE001 - a stderr that cannot be written must not stop the program
        pass


def _import_hooks():
    """Our modules: the stacks, then the framework's (each does its work on import)."""
    names = ["_trainer_launcher_stacks"]
    names += [name.strip() for name in os.environ.get("TRAINER_LAUNCHER_RANK_HOOKS", "").split(",")]
    for name in names:
        if not name.startswith("_trainer_launcher_"):
            continue  # only ours: the variable cannot make a rank import anything else
        try:  # noqa: SIM105 - no contextlib: this file imports nothing more into the user's program
            __import__(name)
        except Exception:  # noqa: BLE001 - never let the hook stop the user's program
            pass  # without the hook, the program runs as it would have


_import_hooks()
_chain()
