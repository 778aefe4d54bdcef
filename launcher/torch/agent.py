"""The torchrun agent: torchrun's own entry point in a child process.

The launcher never imports torch. It starts this module as soon as it knows the job is a torch
job, so ``import torch`` (about a second) overlaps the launcher's validation and DNS/port waits.
Then, over the control pipe, the launcher sends one JSON line: the torchrun arguments, the
environment changes and, for a multi-node job of fixed size, where the job's store is
(launcher.torch.peers). torchrun reduces every worker failure to exit code 1; here we catch its
failure record instead and write a report. The agent then tells the launcher (status pipe), which
classifies this node's outcome (it alone has seen the ranks' output) and sends it back as a second
line. Only then does the agent share it with the other nodes, wait for theirs, and exit.

Usage (internal): python -m launcher.torch.agent --control-fd FD --status-fd FD --report PATH --job PATH
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import sys
import threading
from typing import TYPE_CHECKING, NoReturn

from launcher.core.crash import INTERNAL_ERROR, crash_site, describe, raised_in_launcher
from launcher.core.failure_policy import DEFAULT_GRACE_PERIOD
from launcher.runner import report as records
from launcher.torch import compat

if TYPE_CHECKING:
    from launcher.torch.ahead import RanksAhead
    from launcher.torch.peers import Peers


def _write_json(path: str, data: object) -> None:
    temporary = f"{path}.tmp"
    with open(temporary, "w") as handle:
        json.dump(data, handle)
    os.replace(temporary, path)


_AGENT_PID = os.getpid()
RESTART_COUNT = "LAUNCHER_RESTART_COUNT"  # launcher.core.lifecycle.restart_env


def _bound_to_agent() -> None:
    """In each rank before it execs: PR_SET_PDEATHSIG, so a SIGKILLed agent (or launcher) never
    leaves ranks running; exit at once if the agent is already gone."""
    import ctypes

    parent = _AGENT_PID
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(128 + signal.SIGKILL)


def _rank_reports(failures: dict) -> list[dict]:
    """A report of each failed rank (launcher/runner/report.py), as torchrun recorded it."""
    found = []
    for rank, failure in failures.items():  # torchrun inserts real failures first
        signaled = failure.exitcode < 0
        found.append(
            records.report(
                "failed",
                None if signaled else failure.exitcode,
                rank=int(rank),
                local_rank=failure.local_rank,
                signal=failure.signal_name() if signaled else None,
                at=failure.timestamp,
                error=_recorded_message(failure),
            )
        )
    return found


def _first(found: list[dict]) -> dict:
    """The root cause: the earliest failure that torchrun's own teardown did not cause. torchrun
    records the ranks it SIGTERMed after the first failure as failures too, with timestamps in
    whole seconds, so its ``get_first_failure`` can name a victim."""
    own = [f for f in found if f.get("signal") != "SIGTERM"] or found
    return min(own, key=lambda f: f["at"])


def _recorded_message(failure) -> str | None:
    """What a worker that used @record (or ErrorHandler) wrote; otherwise torchrun's message is a
    doc link. The file holds {"message": "Type: text", "extraInfo": ...} under "message"."""
    if not os.path.isfile(failure.error_file):
        return None
    message = failure.message
    if isinstance(message, dict):
        message = message.get("message")
    return str(message) if message else None


def _stop_record(failures: dict, generation: int) -> records.StopRecord:
    """The job's stop record for this node's ranks' failure (Peers.publish_stop adds where)."""
    root = _first(_rank_reports(failures)) if failures else {}
    return records.StopRecord(
        generation=generation,
        rank=root.get("rank"),
        local_rank=root.get("localRank"),
        exit_code=root.get("exitCode"),
        signal=root.get("signal"),
    )


def _shutdown_timeout(grace: float) -> int:
    """What torchrun will read (the user's TORCH_ELASTIC_SHUTDOWN_TIMEOUT wins over our grace)."""
    try:
        return max(0, int(os.environ["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"]))
    except (KeyError, ValueError):
        return max(1, int(grace))


def _prepare_dump_dir() -> None:
    """The flight-recorder dumps go to <prefix><rank>: its directory must exist when a rank dumps."""
    for name in ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"):
        prefix = os.environ.get(name)
        if prefix and os.path.dirname(prefix):
            with contextlib.suppress(OSError):  # the ranks then log torch's own error on a dump;
                os.makedirs(os.path.dirname(prefix), exist_ok=True)  # the job is not at stake
            return


def _dump_local_stacks() -> list[dict]:
    """This node's ranks' stacks, logged here (the launcher relays our stderr), their top frames
    returned for the node that asked (launcher.torch.peers). Never raises: a hang is being ended."""
    try:
        from launcher.status import stacks

        directory = os.environ.get(stacks.STACKS_ENV)
        taken = stacks.collect(directory) if directory else []
        stacks.echo(taken, lambda line: print(line, file=sys.stderr, flush=True))
        return [{"rank": s.rank, "localRank": s.local_rank, "pid": s.pid, "top": list(s.top)} for s in taken]
    except Exception as error:  # noqa: BLE001
        print(f"trainer-launcher: could not take this node's stacks: {error}", file=sys.stderr, flush=True)
        return []


class Agent:
    def __init__(self, control, status_fd: int, report: str, job: str, grace: float):
        self.control, self.status_fd, self.report, self.job = control, status_fd, report, job
        self.grace = grace
        self.peers: Peers | None = None
        self.stores: list = []  # torchrun's rendezvous stores, kept until this process exits
        self.workers: list = []
        self.find_workers = lambda: self.workers  # torchrun's ranks, as Popen-like handles
        self._stopping = False  # we SIGTERMed ourselves because a peer failed
        self.ahead: RanksAhead | None = None  # ranks started ahead of this generation (a restart)
        self._finishing = threading.Lock()

    def run(self, torchrun, args: list[str]) -> NoReturn:
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

        try:
            torchrun.main(args)
        except ChildFailedError as error:
            if self.peers is not None:
                generation = self.peers.config.generation
                self.peers.publish_stop(_stop_record(error.failures, generation))  # a no-op if the hook did it
            # Ranks that failed on their own stay this node's failure, though another node published
            # first (the job's root cause is settled between the nodes: launcher.core.job_outcome);
            # ranks that failed as we stopped them for a peer are that peer's victims.
            found = _rank_reports(error.failures)
            root = _first(found)
            ending = "stopped" if self._stopping else "failed"
            self.finish(
                records.report(
                    ending, 1, rank=root["rank"], local_rank=root.get("localRank"), ranks=found, **self._stopped_by()
                )
            )
        except SignalException as error:
            code = 128 + error.sigval
            if self._stopping:
                self.finish(records.report(self._stop_ending(), code, **self._stopped_by()))
            self.finish(records.report("failed", code, signal=signal.Signals(error.sigval).name))
        except SystemExit as error:  # torchrun's own argument errors
            code = error.code if isinstance(error.code, int) else 2
            if code:
                self.finish(records.report("refused", code, error="torchrun rejected its arguments"))
        except Exception as error:  # noqa: BLE001 - rendezvous and store failures end up here, and our hooks' bugs
            if raised_in_launcher(error):
                self.crashed(error)
            print(f"trainer-launcher: torchrun failed: {type(error).__name__}: {error}", file=sys.stderr)
            self.finish(records.report("refused", 1, error=f"{type(error).__name__}: {error}"))
        self.finish(records.report("succeeded", 0))

    def crashed(self, error: BaseException) -> NoReturn:
        """The agent's own bug (not torchrun's, not the program's): report it as the launcher's."""
        import traceback

        traceback.print_exception(error)
        self.finish(records.report("crashed", INTERNAL_ERROR, error=describe(error), where=crash_site(error)))

    def _stopped_by(self) -> dict:
        """A peer's stop record, or the lost store's address, once this node is its victim."""
        peers = self.peers
        if peers is None or peers.role != "victim":
            return {}
        if peers.stop_record is not None:
            return {"stopped_by": peers.stop_record.to_json()}
        return {"peer": peers.lost}

    def _stop_ending(self) -> str:
        peers = self.peers
        return "peerLost" if peers is not None and peers.stop_record is None else "stopped"

    def on_peer_stop(self) -> NoReturn:
        """A peer failed (watcher thread). With ranks running, SIGTERM ourselves: torchrun's own
        handler stops them and raises in the main thread, which finishes. Without, torchrun is
        blocked in the store, where no signal handler runs, so finish from here: its ranks all
        succeeded (it sits in its exit barrier), or one failed (the peer's loss broke their
        collectives first, and torchrun is stuck telling a store that is gone): never a success."""
        workers = self.find_workers()
        codes = [worker.poll() for worker in workers]
        if any(code is None for code in codes):
            self._stopping = True
            os.kill(os.getpid(), signal.SIGTERM)
            # torchrun waits TORCH_ELASTIC_SHUTDOWN_TIMEOUT (the grace period) for its ranks.
            threading.Event().wait(self.grace + 10)
            from launcher.torch.peers import stop_local_ranks

            stop_local_ranks(workers, 0)
            self.finish(records.report(self._stop_ending(), 128 + signal.SIGTERM, **self._stopped_by()))
        failed = [code for code in codes if code]
        if failed:
            from launcher.core.outcome import code_for  # only here: the agent's start does without it

            self.finish(records.report(self._stop_ending(), code_for(failed[0]), **self._stopped_by()))
        self.finish(records.report("succeeded", 0, **self._stopped_by()))

    def finish(self, report: dict) -> NoReturn:
        """Report, hear the launcher's verdict, share it with the other nodes, exit. Runs once:
        whichever thread gets here first ends the process."""
        self._finishing.acquire()
        if self.ahead is not None:
            self.ahead.close()
        records.write(self.report, report)
        try:
            os.write(self.status_fd, b"reported\n")
            verdict = self.control.readline()
        except OSError:
            verdict = b""  # the launcher is gone
        if self.peers is not None:
            outcome = json.loads(verdict) if verdict.strip() else None
            _write_json(self.job, self.peers.conclude(outcome))
        # Nothing is left to do: skip the interpreter's (and torch's) finalisation, which would
        # only delay the launcher's exit.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(report["exitCode"])


def main(argv: list[str]) -> int:
    def arg(name: str) -> str:
        return argv[argv.index(name) + 1]

    control = os.fdopen(int(arg("--control-fd")), "rb")
    agent = Agent(control, int(arg("--status-fd")), arg("--report"), arg("--job"), DEFAULT_GRACE_PERIOD)
    ahead = arg("--ranks-ahead") if "--ranks-ahead" in argv else None
    try:
        return _run(agent, ahead)
    except Exception as error:  # noqa: BLE001 - anything torchrun.main did not raise is ours
        agent.crashed(error)


def _start_ranks_ahead(agent: Agent, path: str) -> None:
    """A standby agent's ranks (launcher.torch.ahead), started before torch is imported here, so
    that all of them import at once: ``path`` holds their count and the variables the plan gives
    every rank."""
    from launcher.torch.ahead import RanksAhead

    with open(path) as handle:
        planned = json.load(handle)
    from launcher.status.stacks import BOARD_ENV, STACKS_ENV

    env = {name: value for name, value in os.environ.items() if name not in planned["unset"]}
    env.update(planned["env"])
    # Found by a hang's stack dump only once it is a rank: it registers as it becomes one.
    for name in (STACKS_ENV, BOARD_ENV):
        env.pop(name, None)
    agent.ahead = RanksAhead()
    agent.ahead.start(int(planned["nproc"]), env, _bound_to_agent)


def _run(agent: Agent, ahead: str | None = None) -> int:
    control = agent.control
    # The launcher sends SIGUSR1/SIGUSR2 to every rank's group directly; the agent must survive them.
    for sig in (signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, lambda *_: None)
    if ahead is not None:  # their imports and ours at once
        _start_ranks_ahead(agent, ahead)
    # The agent's own C++ warnings are store chatter (a peer that left); the ranks keep the
    # user's level: the variable is read once, when torch loads.
    quiet = "TORCH_CPP_LOG_LEVEL" not in os.environ
    if quiet:
        os.environ["TORCH_CPP_LOG_LEVEL"] = "ERROR"
    # torch's import makes millions of objects that the cyclic collector would walk again and again
    # (a third of the import's CPU): paused over it, and what it made frozen out of later passes.
    gc.disable()
    try:
        import torch.distributed.run as torchrun
    except ImportError as error:
        said = f"torch is not importable ({error}): install torch in this image"
        from launcher.core.reasons import Reasons

        agent.finish(records.report("refused", 2, reason=Reasons.CONFIG_ERROR, error=said))
    gc.freeze()
    gc.enable()
    if quiet:
        del os.environ["TORCH_CPP_LOG_LEVEL"]
    request = control.readline()
    if not request:
        if agent.ahead is not None:
            agent.ahead.close()
        return 0  # the launcher gave up before starting (bad config, timeout, signal), or never restarted
    plan = json.loads(request)
    for name in plan["unset"]:
        os.environ.pop(name, None)
    os.environ.update(plan["env"])
    agent.grace = float(plan.get("grace", agent.grace))
    # How long torchrun gives its ranks after SIGTERM: the launcher's grace, unless you chose.
    os.environ.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(max(1, int(agent.grace))))
    compat.stop_within_grace(_shutdown_timeout(agent.grace))
    compat.terminate_once()
    _prepare_dump_dir()
    # A restart in place is the launcher's (torchrun's own count is always 0): the ranks see its count.
    restarts = {"TORCHELASTIC_RESTART_COUNT": os.environ[RESTART_COUNT]} if RESTART_COUNT in os.environ else None
    take = agent.ahead.take if agent.ahead is not None else None
    if not compat.bind_workers(agent.workers, _bound_to_agent, restarts, take):
        agent.find_workers = compat.child_processes
    if plan.get("peers"):
        from launcher.torch.peers import PeerConfig, Peers

        config = PeerConfig.from_json(plan["peers"])
        if config is None:  # None only for no peers, and the plan has some
            raise ValueError(f"the plan's peers are not a peer configuration: {plan['peers']!r}")
        peers = agent.peers = Peers(config, agent.on_peer_stop, _dump_local_stacks)
        compat.publish_final_failures(lambda failures: peers.publish_stop(_stop_record(failures, config.generation)))

        # On the node serving the job's store, the server lives as long as torchrun's store
        # object: held here, until the other nodes are done with it (Peers.conclude). The
        # watcher dials its own client once the agent has joined (Peers.joined).
        def joined(store) -> None:
            if store is not None:
                agent.stores.append(store)
            peers.joined()

        if not compat.keep_rendezvous_store(joined):
            peers.joined()
        peers.start()
    if plan.get("entry"):  # torch.distributed.launch: torchrun's run under its own main
        import importlib

        torchrun = importlib.import_module(plan["entry"])
    agent.run(torchrun, plan["args"])
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
