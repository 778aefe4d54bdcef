"""The fault a restart test's program plays (resume.py, jax_resume.py, mpi_resume.py,
xgboost_resume.py), from FAIL=<ending>@<step>[@<generations>]: <ending> is exit:<code> or
signal:<NAME> (the process sends itself the signal), in the given generations (comma-separated;
default 0: only the first start). HANG=<step>[@<generations>]: the process stops at that step for
good (stuck_forever, a name the hang's stacks show). PROGRESS=1: each step says "step=N", the
progress a hang is timed from. Each program imports it from its own folder (sys.path[0]) and says
which of its processes plays it."""

import os
import signal
import sys
import time


class Fault:
    def __init__(self, spec: str):
        parts = spec.split("@") if spec else []
        self.ending = parts[0] if parts else None
        self.step = int(parts[1]) if parts else -1
        self.generations = tuple(int(g) for g in (parts[2] if len(parts) > 2 else "0").split(","))

    def due(self, step: int, generation: int) -> bool:
        """Whether the fault comes at ``step`` of ``generation`` (to the process that plays it)."""
        return self.ending is not None and step == self.step and generation in self.generations

    def end(self) -> None:
        how, _, what = self.ending.partition(":")
        if how == "exit":
            sys.exit(int(what))
        os.kill(os.getpid(), signal.Signals[what])
        time.sleep(60)


FAIL = Fault(os.environ.get("FAIL", ""))


class Hang(Fault):
    def __init__(self, spec: str):
        super().__init__(f"hang@{spec}" if spec else "")

    def end(self) -> None:
        stuck_forever()


def stuck_forever() -> None:
    while True:
        time.sleep(60)


def progress(step: int) -> None:
    if os.environ.get("PROGRESS") == "1":
        print(f"step={step}", flush=True)


HANG = Hang(os.environ.get("HANG", ""))
