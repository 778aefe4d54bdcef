"""What one JAX pod runs, planned from the JAX_* variables (pure) and printed by
``trainer-launcher plan --framework jax`` (the real CLI, which must start nothing and import no jax)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.core import python_argv
from launcher.jax.plan import CPU_COLLECTIVES_ENV, INIT_TIMEOUT_ENV, JaxFacts, plan_jax
from launcher.jax.settings import JaxSettings

REPO = Path(__file__).resolve().parents[1]
RUNNER = "/opt/launcher/jax/run.py"
COORDINATOR = ("tj-node-0-0.tj", 29500)


def settings(**values) -> JaxSettings:
    values = {"num_processes": 4, "process_id": 2, "coordinator": COORDINATOR, **values}
    return JaxSettings.model_construct(**{"cpu_collectives": None, "initialize": True, **values})


def facts(gpus: int = 0) -> JaxFacts:
    return JaxFacts(hostname="tj-node-0-2", gpu_count=gpus, runner=RUNNER, rendezvous_timeout=600.0)


def plan(program, gpus: int = 0, **values):
    return plan_jax(settings(**values), facts(gpus), tuple(program), {})


# --- which commands go through the runner ------------------------------------------------------

@pytest.mark.parametrize("program, runs", [
    (["python", "train.py", "--lr", "3"], ["python", RUNNER, "train.py", "--lr", "3"]),
    (["python3", "-u", "train.py"], ["python3", "-u", RUNNER, "train.py"]),
    (["/usr/bin/python3.12", "-X", "importtime", "-W", "ignore", "t.py"],
     ["/usr/bin/python3.12", "-X", "importtime", "-W", "ignore", RUNNER, "t.py"]),
    (["python", "-Wignore", "-uB", "t.py", "-m", "x"], ["python", "-Wignore", "-uB", RUNNER, "t.py", "-m", "x"]),
    (["python", "-m", "trainer.main", "--cfg", "a.yaml"], ["python", RUNNER, "-m", "trainer.main", "--cfg", "a.yaml"]),
    (["python", "-mtrainer.main"], ["python", RUNNER, "-m", "trainer.main"]),
    (["python", "-u", "-c", "import jax", "arg"], ["python", "-u", RUNNER, "-c", "import jax", "arg"]),
    (["python", "-uc", "print(1)"], ["python", "-u", RUNNER, "-c", "print(1)"]),
    (["python", "--check-hash-based-pycs", "never", "t.py"],
     ["python", "--check-hash-based-pycs", "never", RUNNER, "t.py"]),
    (["python", "--", "t.py", "--", "x"], ["python", RUNNER, "t.py", "--", "x"]),
])
def test_a_python_program_runs_through_the_runner_with_its_options_kept(program, runs):
    planned = plan(program)
    assert planned.runner
    assert list(planned.argv) == runs
    assert list(planned.program) == program


@pytest.mark.parametrize("program", [
    ["bash", "-c", "python train.py"],  # a shell: the program initializes JAX itself
    ["./train"], ["python"], ["python", "-"], ["python", "-V"], ["python", "--version"],
    ["python", "-c"], ["python", "--some-future-flag", "t.py"], ["pythonw", "t.py"], ["ipython", "t.py"],
])
def test_anything_else_runs_unchanged(program):
    planned = plan(program)
    assert not planned.runner
    assert list(planned.argv) == program
    assert INIT_TIMEOUT_ENV not in planned.env_set


def test_the_user_can_opt_out_of_the_runner():
    planned = plan(["python", "train.py"], initialize=False)
    assert not planned.runner and list(planned.argv) == ["python", "train.py"]
    assert "LAUNCHER_JAX_INITIALIZE=0" in planned.runner_why


def test_a_single_process_without_a_coordinator_has_nothing_to_initialize():
    planned = plan(["python", "t.py"], num_processes=1, process_id=0, coordinator=None)
    assert not planned.runner
    assert planned.resolve is None and planned.connect is None


def test_python_argv_names_the_parts():
    command = python_argv.parse(["python3", "-O", "-m", "pkg.mod", "a", "b"])
    assert command == python_argv.PythonCommand("python3", ("-O",), "module", "pkg.mod", ("a", "b"))


# --- waiting, collectives, one process per pod --------------------------------------------------

def test_every_process_but_0_waits_for_the_coordinators_name_and_port():
    planned = plan(["python", "t.py"])
    assert planned.resolve == "tj-node-0-0.tj"
    assert planned.connect == COORDINATOR


def test_process_0_waits_only_for_its_own_name():
    planned = plan(["python", "t.py"], process_id=0)
    assert planned.resolve == "tj-node-0-0.tj" and planned.connect is None
    assert planned.to_json()["servesCoordinator"] is True


def test_an_ipv6_coordinator_is_waited_for_without_brackets():
    planned = plan(["python", "t.py"], coordinator=("[fd00::1]", 29500))
    assert planned.resolve == "fd00::1" and planned.connect == ("fd00::1", 29500)
    assert planned.coordinator_address == "[fd00::1]:29500"


# --- restarts in place ------------------------------------------------------------------------

def test_a_restart_moves_the_coordinator_a_port_per_generation_and_tells_the_program():
    first, third = plan(["python", "t.py"]), plan_jax(settings(), facts(), ("python", "t.py"), {}, generation=2)
    assert first.coordinator_address == "tj-node-0-0.tj:29500" and "JAX_COORDINATOR_ADDRESS" not in first.env_set
    assert third.coordinator_address == "tj-node-0-0.tj:29502"
    assert third.env_set["JAX_COORDINATOR_ADDRESS"] == "tj-node-0-0.tj:29502"
    assert third.connect == ("tj-node-0-0.tj", 29502)


def test_a_coordinator_port_without_room_for_the_restarts_is_refused_naming_it():
    from launcher.core.outcome import ConfigError

    with pytest.raises(ConfigError) as refused:
        plan_jax(settings(coordinator=("tj", 65535)), facts(), ("python", "t.py"), {}, generation=1)
    assert str(refused.value) == (
        "JAX_COORDINATOR_ADDRESS='tj:65535': expected a port with room for 1 restarts above it (up to 65535)"
    )


def test_local_picks_a_coordinator_port_with_the_port_of_each_restart_free_too(monkeypatch):
    """A restart's coordinator listens a port further on: `local` must not pick a port whose next
    one is taken. Here the first pick has it taken, for real: a listening socket holds it."""
    import argparse
    import random
    import socket
    from types import SimpleNamespace

    from launcher.jax import local
    from launcher.local.nodes import pods

    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    taken = held.getsockname()[1]
    offers = iter([taken - 1])
    real = random.SystemRandom.randrange

    def first_pick_next_to_the_taken_port(self, *bounds):
        return next(offers, None) or real(self, *bounds)

    monkeypatch.setattr(random.SystemRandom, "randrange", first_pick_next_to_the_taken_port)
    args = argparse.Namespace(nproc_per_node="1", master_port=None)
    try:
        env_of, _ = local.setup(pods("2", "tj", "none"), args, SimpleNamespace(max_restarts=1))
    finally:
        held.close()
    coordinator = int(env_of(1, {})["JAX_COORDINATOR_ADDRESS"].rsplit(":", 1)[1])
    assert coordinator != taken - 1


def test_the_runner_keys_its_stop_record_by_the_launchers_restart_count():
    from launcher.jax import run as runner
    from launcher.runner import report as records

    env = {"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1", "JAX_COORDINATOR_ADDRESS": "tj:29501"}
    assert runner.Config(env).stop_key == records.stop_key(0)
    config = runner.Config({**env, "LAUNCHER_RESTART_COUNT": "1"})
    assert (config.generation, config.stop_key) == (1, records.stop_key(1))


def test_cpu_collectives_are_gloo_without_a_gpu_unless_the_user_chose():
    assert plan(["python", "t.py"]).env_set[CPU_COLLECTIVES_ENV] == "gloo"
    assert CPU_COLLECTIVES_ENV not in plan(["python", "t.py"], gpus=8).env_set
    assert CPU_COLLECTIVES_ENV not in plan(["python", "t.py"], cpu_collectives="mpi").env_set


def test_a_multi_gpu_pod_keeps_one_process():
    planned = plan(["python", "t.py"], gpus=8)
    assert planned.to_json()["processesInThisPod"] == 1
    assert planned.argv.count(RUNNER) == 1
    assert "CUDA_VISIBLE_DEVICES" not in planned.env_set


def test_jax_waits_to_join_as_long_as_the_launcher_waits_for_the_coordinator():
    planned = plan_jax(settings(), JaxFacts("n", 0, RUNNER, 90.5), ("python", "t.py"), {})
    assert planned.env_set[INIT_TIMEOUT_ENV] == "91"


# --- the real CLI --------------------------------------------------------------------------------

def plan_cli(*args: str, **env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "LAUNCHER_", "PET_"))}
    clean.update(env, PYTHONPATH=str(REPO))
    script = ("import runpy, sys; sys.argv = ['launcher', *sys.argv[1:]]\n"
              "try:\n    runpy.run_module('launcher', run_name='__main__')\n"
              "finally:\n    print('JAX-IMPORTED' if 'jax' in sys.modules else '', file=sys.stderr)\n")
    result = subprocess.run([sys.executable, "-c", script, "plan", "--framework", "jax", *args],
                            cwd=REPO, env=clean, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "JAX-IMPORTED" not in result.stderr, "plan must not import jax"
    return json.loads(result.stdout)


def test_plan_prints_what_trainer_injects_and_what_will_run():
    printed = plan_cli("--", "python", "-u", "train.py", "--steps", "5", JAX_NUM_PROCESSES="3", JAX_PROCESS_ID="1",
                       JAX_COORDINATOR_ADDRESS="tj-node-0-0.tj:29500", HOSTNAME="tj-node-0-1",
                       LAUNCHER_RENDEZVOUS_TIMEOUT="2m")
    assert printed["framework"] == "jax"
    assert (printed["processId"], printed["numProcesses"], printed["coordinator"]) == (1, 3, "tj-node-0-0.tj:29500")
    assert printed["node"] == "tj-node-0-1"
    assert printed["argv"][:2] == ["python", "-u"] and printed["argv"][2].endswith("launcher/jax/run.py")
    assert printed["argv"][3:] == ["train.py", "--steps", "5"]
    assert printed["initialize"]["byLauncher"] is True
    assert printed["wait"] == {"resolve": "tj-node-0-0.tj", "connect": ["tj-node-0-0.tj", 29500]}
    assert printed["env"]["set"][INIT_TIMEOUT_ENV] == "120"
    assert printed["sources"] == {"num_processes": "JAX_NUM_PROCESSES", "process_id": "JAX_PROCESS_ID",
                                  "coordinator": "JAX_COORDINATOR_ADDRESS"}
    assert printed["launcher"]["rendezvousTimeout"] == 120.0


def test_plan_takes_the_process_id_from_the_completion_index_when_jax_process_id_is_missing():
    printed = plan_cli(JAX_NUM_PROCESSES="2", JOB_COMPLETION_INDEX="1", JAX_COORDINATOR_ADDRESS="tj-node-0-0.tj:29500")
    assert printed["processId"] == 1 and printed["sources"]["process_id"] == "JOB_COMPLETION_INDEX"


def test_plan_with_the_runner_turned_off_by_flag():
    printed = plan_cli("--jax-initialize", "0", "--", "python", "t.py", JAX_NUM_PROCESSES="2", JAX_PROCESS_ID="0",
                       JAX_COORDINATOR_ADDRESS="tj-node-0-0.tj:29500")
    assert printed["argv"] == ["python", "t.py"] and printed["initialize"]["byLauncher"] is False
    assert printed["sources"]["initialize"] == "--jax-initialize"
