"""Settings + host facts -> what one pod runs for a JAX job. Pure: no I/O, no clock.

One process per pod, whatever its GPU count: a JAX process drives every local device itself.
Every process but 0 waits for the coordinator's name and port; process 0 serves the coordinator
and waits only for its own name, through which it also reaches its own service.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from launcher.core import python_argv
from launcher.core.lifecycle import generation_port

if TYPE_CHECKING:  # pydantic stays out of the launcher's first milliseconds (see launcher.jax.job)
    from launcher.jax.settings import JaxSettings

# What the launcher tells its runner (launcher/jax/run.py) in its go word, beside the JAX_* variables.
INIT_TIMEOUT_ENV = "TRAINER_LAUNCHER_JAX_INIT_TIMEOUT"
REPORT_ENV = "TRAINER_LAUNCHER_JAX_REPORT"
CPU_COLLECTIVES_ENV = "JAX_CPU_COLLECTIVES_IMPLEMENTATION"
COORDINATOR_ENV = "JAX_COORDINATOR_ADDRESS"


@dataclass(frozen=True)
class JaxFacts:
    """What the side-effect layer found on this host."""

    hostname: str
    gpu_count: int
    runner: str  # the path of launcher/jax/run.py, run by path so any interpreter with jax can
    rendezvous_timeout: float


@dataclass(frozen=True)
class JaxPlan:
    process_id: int
    num_processes: int
    coordinator: tuple[str, int] | None
    node: str
    gpu_count: int
    program: tuple[str, ...]  # as the user gave it
    argv: tuple[str, ...]  # what runs
    runner: bool  # argv runs the program through launcher.jax.run
    runner_why: str
    env_set: dict[str, str]
    resolve: str | None  # a name that must resolve before the program starts
    connect: tuple[str, int] | None  # a port that must accept before the program starts
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def coordinator_address(self) -> str | None:
        return None if self.coordinator is None else f"{self.coordinator[0]}:{self.coordinator[1]}"

    def to_json(self) -> dict:
        return {
            "framework": "jax",
            "processId": self.process_id,
            "numProcesses": self.num_processes,
            "coordinator": self.coordinator_address,
            "servesCoordinator": self.coordinator is not None and self.process_id == 0,
            "node": self.node,
            "gpus": self.gpu_count,
            "processesInThisPod": 1,
            "program": list(self.program),
            "argv": list(self.argv),
            "initialize": {"byLauncher": self.runner, "why": self.runner_why},
            "env": {"set": self.env_set},
            "wait": {"resolve": self.resolve, "connect": list(self.connect) if self.connect else None},
            "sources": self.sources,
        }


def runner_argv(command: python_argv.PythonCommand, runner: str) -> tuple[str, ...]:
    """The user's ``python [OPTIONS] TARGET ARGS`` with the runner between options and target."""
    return (command.interpreter, *command.options, runner, *command.target_argv(), *command.args)


def _runner_choice(jax: JaxSettings, program: tuple[str, ...]) -> tuple[python_argv.PythonCommand | None, str]:
    if not jax.initialize:
        return None, "LAUNCHER_JAX_INITIALIZE=0: the program initializes JAX itself"
    if jax.coordinator is None:
        return None, "a single process without JAX_COORDINATOR_ADDRESS: nothing to initialize"
    command = python_argv.parse(program)
    if command is None:
        return None, (
            "not a `python [OPTIONS] SCRIPT|-m MODULE|-c CODE` command: the program initializes "
            "JAX itself, from the JAX_* variables"
        )
    return command, (
        "jax.distributed.initialize() from JAX_* before the program; the program's own call then does nothing"
    )


def plan_jax(
    jax: JaxSettings, facts: JaxFacts, program: tuple[str, ...], sources: dict[str, str], generation: int = 0
) -> JaxPlan:
    """``generation``: which start in place of the job this plans (launcher.core.lifecycle): its
    coordinator listens ``generation`` ports above the first one's, so that a process never joins
    the last generation's coordination service."""
    command, why = _runner_choice(jax, program)
    argv = runner_argv(command, facts.runner) if command is not None else program
    env: dict[str, str] = {}
    coordinator = jax.coordinator
    if coordinator is not None and generation:
        name = sources.get("coordinator") or COORDINATOR_ENV
        given = f"{coordinator[0]}:{coordinator[1]}"
        coordinator = (coordinator[0], generation_port(coordinator[1], generation, name, given))
        env[COORDINATOR_ENV] = f"{coordinator[0]}:{coordinator[1]}"
    if facts.gpu_count == 0 and jax.cpu_collectives is None:
        # Without it a JAX older than 0.5 has no cross-process collectives on CPU at all.
        env[CPU_COLLECTIVES_ENV] = "gloo"
    if command is not None:
        env[INIT_TIMEOUT_ENV] = str(max(1, math.ceil(facts.rendezvous_timeout)))
    resolve, connect = None, None
    if coordinator is not None:
        resolve = coordinator[0].strip("[]")
        if jax.process_id != 0:
            connect = (resolve, coordinator[1])
    return JaxPlan(
        process_id=jax.process_id,
        num_processes=jax.num_processes,
        coordinator=coordinator,
        node=facts.hostname,
        gpu_count=facts.gpu_count,
        program=tuple(program),
        argv=tuple(argv),
        runner=command is not None,
        runner_why=why,
        env_set=env,
        resolve=resolve,
        connect=connect,
        sources=sources,
    )
