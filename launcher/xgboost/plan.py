"""Settings + host facts -> what one pod runs for an XGBoost job. Pure: no I/O, no clock.

Trainer counts ``DMLC_NUM_WORKER`` as numNodes x (GPUs per node, or 1) but gives each pod a single
``DMLC_TASK_ID``, its pod index. A pod with G GPUs therefore runs G workers, with task ids
``pod_index * G + local`` and one GPU each; a CPU pod runs one worker, which uses every core.
Upstream's image runs one process per pod, so with G > 1 its tracker waits for workers that never
come.

The RabitTracker runs on pod 0 (``DMLC_TRACKER_URI`` names it). By default the launcher runs it
there as a supervised process and runs a ``python`` program through launcher/xgboost/run.py, which
joins the collective before the program starts. With ``LAUNCHER_XGBOOST_TRACKER=program`` (the
default for a command that is not ``python ...``) the program's task 0 starts the tracker itself,
as upstream's examples do, and the command runs as given.

A restart in place (launcher.core.lifecycle) plans its generation g afresh: its tracker listens
``PORTS_PER_GENERATION`` x g above ``DMLC_TRACKER_PORT``, and every worker is told that port, so
that no worker joins the last generation's tracker and no tracker lands on its stop board.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from launcher.core import python_argv
from launcher.core.lifecycle import generation_port
from launcher.core.outcome import ConfigError
from launcher.xgboost.board import PORT_OFFSET

if TYPE_CHECKING:  # pydantic stays out of the plan's imports
    from launcher.xgboost.settings import XGBoostSettings

LOOPBACK = "127.0.0.1"
# The ports one start of the job takes: the tracker's, and pod 0's stop board after it (board.py).
PORTS_PER_GENERATION = 1 + PORT_OFFSET


@dataclass(frozen=True)
class XGBoostFacts:
    """What the side-effect layer found on this host."""

    hostname: str
    gpu_count: int  # visible NVIDIA GPUs (MIG devices included): XGBoost runs on CUDA only
    cuda_visible_devices: str | None
    whole_cpus: int
    omp_num_threads_set: bool
    python: str  # the launcher's interpreter: the tracker's when the command is not `python ...`
    runner: str  # the path of launcher/xgboost/run.py, run by path so any interpreter with xgboost can
    tracker_script: str  # the path of launcher/xgboost/tracker.py


@dataclass(frozen=True)
class Worker:
    task_id: int
    local_rank: int
    env_set: dict[str, str]


@dataclass(frozen=True)
class XGBoostPlan:
    pod_index: int
    num_worker: int
    workers_per_pod: int
    workers_why: str
    node: str
    tracker_host: str
    tracker_port: int
    tracker_by: str  # "launcher" or "program"
    tracker_why: str
    tracker_argv: tuple[str, ...] | None  # set on the pod whose launcher runs the tracker
    program: tuple[str, ...]  # as the user gave it
    argv: tuple[str, ...]  # what each worker runs
    runner: bool  # argv runs the program through launcher/xgboost/run.py
    workers: tuple[Worker, ...]
    resolve: str | None  # a name that must resolve before the workers go
    connect: tuple[str, int] | None  # the tracker's port, which must accept before the workers go
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def pods(self) -> int:
        return self.num_worker // self.workers_per_pod

    @property
    def runs_tracker(self) -> bool:
        return self.tracker_argv is not None

    def to_json(self) -> dict:
        return {
            "framework": "xgboost",
            "podIndex": self.pod_index,
            "numWorker": self.num_worker,
            "workersPerPod": self.workers_per_pod,
            "workersWhy": self.workers_why,
            "node": self.node,
            "tracker": {
                "address": f"{self.tracker_host}:{self.tracker_port}",
                "runBy": self.tracker_by,
                "why": self.tracker_why,
                "runsHere": self.runs_tracker,
                "argv": list(self.tracker_argv) if self.tracker_argv else None,
            },
            "program": list(self.program),
            "argv": list(self.argv),
            "collective": {"joinedByLauncher": self.runner},
            "workers": [{"taskId": w.task_id, "localRank": w.local_rank, "env": w.env_set} for w in self.workers],
            "wait": {"resolve": self.resolve, "connect": list(self.connect) if self.connect else None},
            "sources": self.sources,
        }


def workers_per_pod(xgboost: XGBoostSettings, facts: XGBoostFacts, sources: dict[str, str]) -> tuple[int, str]:
    if xgboost.workers_per_pod != "auto":
        return int(xgboost.workers_per_pod), sources.get("workers_per_pod", "LAUNCHER_XGBOOST_WORKERS_PER_POD")
    if facts.gpu_count:
        return facts.gpu_count, f"one per visible NVIDIA GPU ({facts.gpu_count}), as Trainer counts DMLC_NUM_WORKER"
    return 1, "no GPU: one worker per pod, using every core, as Trainer counts DMLC_NUM_WORKER"


def _tracker_choice(xgboost: XGBoostSettings, command: python_argv.PythonCommand | None) -> tuple[str, str]:
    if xgboost.tracker == "program":
        return "program", (
            "LAUNCHER_XGBOOST_TRACKER=program: task 0 of the program starts the tracker, "
            "as upstream's examples do; the command runs as given"
        )
    if xgboost.tracker == "launcher":
        why = "LAUNCHER_XGBOOST_TRACKER=launcher: a supervised process on pod 0"
        if command is None:
            why += (
                "; the command is not `python ...`, so the program joins the collective itself, "
                "with the DMLC_* values, and must not start a tracker"
            )
        return "launcher", why
    if command is None:
        return "program", (
            "not a `python [OPTIONS] SCRIPT|-m MODULE|-c CODE` command: the program runs as given, "
            "and its task 0 starts the tracker, as upstream's examples do"
        )
    return "launcher", (
        "a supervised process on pod 0; each worker joins the collective before the program "
        "(launcher/xgboost/run.py), and the program's own tracker and CommunicatorContext join it"
    )


def _bind_address(tracker_host: str) -> str:
    try:
        return "::" if ipaddress.ip_address(tracker_host).version == 6 else "0.0.0.0"
    except ValueError:
        return "0.0.0.0"


def _gpu_of(local_rank: int, cuda_visible_devices: str | None) -> str:
    """The device a worker gets: its entry of the pod's CUDA_VISIBLE_DEVICES, else its index."""
    if cuda_visible_devices:
        items = [item.strip() for item in cuda_visible_devices.split(",") if item.strip()]
        if local_rank < len(items):
            return items[local_rank]
    return str(local_rank)


def tracker_port(xgboost: XGBoostSettings, sources: dict[str, str], generation: int) -> int:
    """The tracker's port in the job's ``generation``-th start: ``PORTS_PER_GENERATION`` apart, so
    the ports of no two generations (tracker and board) meet."""
    if not generation:
        return xgboost.tracker_port
    name = sources.get("tracker_port", "DMLC_TRACKER_PORT")
    return generation_port(xgboost.tracker_port, generation, name, step=PORTS_PER_GENERATION)


def plan_xgboost(
    xgboost: XGBoostSettings,
    facts: XGBoostFacts,
    program: tuple[str, ...],
    sources: dict[str, str],
    generation: int = 0,
    restarts: int = 0,
) -> XGBoostPlan:
    """``generation``: which start in place of the job this plans; ``restarts``: how many the job
    may make (LAUNCHER_MAX_RESTARTS), whose last one's ports must fit below 65536 too, refused now
    rather than at that restart."""
    port = tracker_port(xgboost, sources, generation)
    tracker_port(xgboost, sources, restarts)
    per_pod, why = workers_per_pod(xgboost, facts, sources)
    if xgboost.num_worker % per_pod:
        raise ConfigError(
            sources.get("num_worker", "DMLC_NUM_WORKER"),
            str(xgboost.num_worker),
            f"a multiple of the {per_pod} workers this pod runs ({why})",
        )
    pods = xgboost.num_worker // per_pod
    if xgboost.task_id >= pods:
        raise ConfigError(
            sources.get("task_id", "DMLC_TASK_ID"),
            str(xgboost.task_id),
            f"a pod index from 0 to {pods - 1}: DMLC_NUM_WORKER={xgboost.num_worker} is "
            f"{pods} pods x {per_pod} workers ({why})",
        )
    command = python_argv.parse(program)
    tracker_by, tracker_why = _tracker_choice(xgboost, command)
    runner = tracker_by == "launcher" and command is not None
    if runner and command is not None:
        argv = (command.interpreter, *command.options, facts.runner, *command.target_argv(), *command.args)
    else:
        argv = tuple(program)
    tracker_host = xgboost.tracker_uri or LOOPBACK
    tracker_argv = None
    if tracker_by == "launcher" and xgboost.task_id == 0:
        python = command.interpreter if command is not None else facts.python
        tracker_argv = (
            python,
            facts.tracker_script,
            "--workers",
            str(xgboost.num_worker),
            "--port",
            str(port),
            "--host",
            _bind_address(tracker_host),
        )
    pin_gpus = facts.gpu_count > 0 and per_pod == facts.gpu_count and per_pod > 1
    workers = []
    for local_rank in range(per_pod):
        env = {
            "DMLC_TRACKER_URI": tracker_host,
            "DMLC_TRACKER_PORT": str(port),
            "DMLC_TASK_ID": str(xgboost.task_id * per_pod + local_rank),
            "DMLC_NUM_WORKER": str(xgboost.num_worker),
        }
        if pin_gpus:
            # XGBoost's device="cuda" means ordinal 0: without this every worker would share GPU 0.
            env["CUDA_VISIBLE_DEVICES"] = _gpu_of(local_rank, facts.cuda_visible_devices)
        if per_pod > 1 and not facts.omp_num_threads_set:
            # Each worker's OpenMP would otherwise start a thread per core of the whole pod.
            env["OMP_NUM_THREADS"] = str(max(1, facts.whole_cpus // per_pod))
        workers.append(Worker(xgboost.task_id * per_pod + local_rank, local_rank, env))
    try:
        ipaddress.ip_address(tracker_host)
        resolve = None
    except ValueError:
        resolve = tracker_host
    # Pod 0's own tracker says when it listens (no probe); in program mode its task 0 starts it.
    connect = (tracker_host, port) if xgboost.task_id != 0 else None
    return XGBoostPlan(
        pod_index=xgboost.task_id,
        num_worker=xgboost.num_worker,
        workers_per_pod=per_pod,
        workers_why=why,
        node=facts.hostname,
        tracker_host=tracker_host,
        tracker_port=port,
        tracker_by=tracker_by,
        tracker_why=tracker_why,
        tracker_argv=tracker_argv,
        program=tuple(program),
        argv=argv,
        runner=runner,
        workers=tuple(workers),
        resolve=resolve,
        connect=connect,
        sources=sources,
    )
