"""An MPI TrainJob on this machine whose worker pod is lost and replaced: `local --mpi`'s pods
(launcher.mpi.local.Cluster: the same network, names, Secret and command lines), started here,
with this script playing the Job controller, which `local` does not.

    python tests/mpi_job_controller.py OUT IMPL LOST WHEN REPLACE [--] PROGRAM...

Runs as root, in a network namespace of its own. Starts every worker pod and the launcher pod,
each pod's output to OUT/<pod>.<start>.log. Once every path in WHEN (comma-separated) exists,
SIGKILLs every process of worker pod LOST (its node gone), then, where REPLACE is "yes", starts
its replacement from nothing. Once the launcher pod has exited, stops the workers with SIGTERM (as the JobSet does)
and exits with the launcher pod's code, its termination message in OUT/termination.json. The pods' knobs come from the environment (LAUNCHER_*).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import psutil

from launcher.mpi.local import Cluster


def start(out: str, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
    starts = len([n for n in os.listdir(out) if n.startswith(f"{name}.")])
    with open(os.path.join(out, f"{name}.{starts}.log"), "wb") as log:
        return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def lose(pod: subprocess.Popen) -> None:
    """Every process of the pod at once, as a node lost: sshd, the ranks' sessions, the launcher."""
    everyone = [psutil.Process(pod.pid), *psutil.Process(pod.pid).children(recursive=True)]
    for process in everyone:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.send_signal(signal.SIGKILL)
    pod.wait()


def wait(condition, seconds: float, what: str) -> None:
    end = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > end:
            sys.exit(f"mpi_job_controller: timed out waiting for {what}")
        time.sleep(0.05)


def main() -> int:
    out, implementation, lost, when, replace, *program = sys.argv[1:]
    program = program[1:] if program[:1] == ["--"] else program
    workdir = tempfile.mkdtemp(prefix="mpi-job-controller-")
    os.chmod(workdir, 0o755)
    cluster = Cluster(workdir, implementation, 2, 2, "local", pwd.getpwnam("mpiuser"), ["--grace-period", "3"])
    workers = [start(out, *cluster.worker(index)) for index in range(2)]
    name, argv, env = cluster.launcher(program)
    launcher = start(out, name, argv, env)
    try:
        wait(lambda: all(os.path.exists(p) for p in when.split(",")) or launcher.poll() is not None, 240,
             "every pod to train")
        if launcher.poll() is None:
            lose(workers[int(lost)])
            if replace == "yes":
                workers[int(lost)] = start(out, *cluster.worker(int(lost)))
        code = launcher.wait(600)
        for worker in workers:
            with contextlib.suppress(ProcessLookupError):
                worker.send_signal(signal.SIGTERM)
        for worker in workers:
            worker.wait(60)
        with contextlib.suppress(FileNotFoundError):
            shutil.copy(env["LAUNCHER_TERMINATION_LOG"], os.path.join(out, "termination.json"))
        return code
    finally:  # a timeout included: nothing of the job outlives this controller
        for pod in (launcher, *workers):
            if pod.poll() is None:  # not yet reaped: its pid is still its own
                with contextlib.suppress(psutil.NoSuchProcess):
                    lose(pod)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
