"""The torchrun agent: torchrun's own entry point in a child process.

The launcher never imports torch. It starts this module as soon as it knows the job is a torch
job, so ``import torch`` (about a second) overlaps the launcher's validation and DNS/port waits;
then it sends the planned torchrun arguments over a pipe. torchrun reduces every worker failure
to exit code 1; here we catch its failure record and hand it back as JSON, so the launcher can
exit with the root-cause rank's own code.

Usage (internal): python -m launcher.torch_agent --control-fd FD --report PATH
"""

from __future__ import annotations

import json
import os
import signal
import sys


def _write_report(path: str, data: dict) -> None:
    temporary = f"{path}.tmp"
    with open(temporary, "w") as handle:
        json.dump(data, handle)
    os.replace(temporary, path)


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def _workers_die_with_agent() -> None:
    """torchrun starts each worker in a new session; give them PR_SET_PDEATHSIG so a SIGKILLed
    agent (or launcher) never leaves ranks running."""
    import ctypes

    from torch.distributed.elastic.multiprocessing.subprocess_handler import subprocess_handler

    libc = ctypes.CDLL(None, use_errno=True)
    real_popen = subprocess_handler.Popen

    def popen(*args, **kwargs):
        parent = os.getpid()

        def in_child() -> None:
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
            if os.getppid() != parent:
                os._exit(128 + signal.SIGKILL)

        kwargs.setdefault("preexec_fn", in_child)
        return real_popen(*args, **kwargs)

    subprocess_handler.Popen = popen


def _failure_record(error) -> dict:
    """Every failed rank, and the root cause: the earliest failure that torchrun's own teardown
    did not cause. torchrun records the ranks it SIGTERMed after the first failure as failures
    too, with timestamps in whole seconds, so its ``get_first_failure`` can name a victim."""
    failures = []
    for rank, failure in error.failures.items():  # torchrun inserts real failures first
        signaled = failure.exitcode < 0
        failures.append({
            "rank": int(rank),
            "localRank": failure.local_rank,
            "exitCode": None if signaled else failure.exitcode,
            "signal": failure.signal_name() if signaled else None,
            "timestamp": failure.timestamp,
            # Only a worker that used @record wrote a message; otherwise torchrun's is a doc link.
            "message": str(failure.message)[:1000] if os.path.isfile(failure.error_file) else None,
        })
    own = [f for f in failures if f["signal"] != "SIGTERM"] or failures
    root = min(own, key=lambda f: f["timestamp"])
    return {"failures": failures, "rootRank": root["rank"]}


def main(argv: list[str]) -> int:
    control_fd, report = int(argv[argv.index("--control-fd") + 1]), argv[argv.index("--report") + 1]
    # The launcher sends SIGUSR1/SIGUSR2 to every rank's group directly; the agent must survive them.
    for sig in (signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, lambda *_: None)
    try:
        import torch.distributed.run as torchrun
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    except ImportError as error:
        _write_report(report, {"error": f"torch is not importable ({error}): install torch in this image"})
        return 2
    request = _read_all(control_fd)
    if not request:
        return 0  # the launcher gave up before starting (bad config, timeout, signal)
    plan = json.loads(request)
    for name in plan["unset"]:
        os.environ.pop(name, None)
    os.environ.update(plan["env"])
    _workers_die_with_agent()
    try:
        torchrun.main(plan["args"])
    except ChildFailedError as error:
        _write_report(report, _failure_record(error))
        return 1
    except SignalException as error:
        _write_report(report, {"signal": signal.Signals(error.sigval).name})
        return 128 + error.sigval
    except SystemExit as error:  # torchrun's own argument errors
        code = error.code if isinstance(error.code, int) else 2
        if code:
            _write_report(report, {"agentError": "torchrun rejected its arguments", "exitCode": code})
        return code
    except Exception as error:  # rendezvous and store failures end up here
        _write_report(report, {"agentError": f"{type(error).__name__}: {error}"[:1000], "type": type(error).__name__})
        print(f"trainer-launcher: torchrun failed: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    # Nothing is left to do once torchrun has returned and the report is written: skip the
    # interpreter's (and torch's) finalisation, which would only delay the launcher's exit.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
