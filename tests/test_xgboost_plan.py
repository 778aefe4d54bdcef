"""The XGBoost plan: DMLC_* + host facts -> this pod's workers, their task ids and devices, and who
runs the tracker. Pure functions, so the GPUs are faked: each test builds the host facts
(XGBoostFacts) with the GPU count and CUDA_VISIBLE_DEVICES of a GPU node; no GPU is touched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.core.outcome import ConfigError
from launcher.xgboost.plan import XGBoostFacts, plan_xgboost
from launcher.xgboost.settings import XGBoostSettings

REPO = Path(__file__).resolve().parents[1]
RUNNER = "/opt/launcher/xgboost/run.py"
TRACKER = "/opt/launcher/xgboost/tracker.py"
URI = "tj-node-0-0.tj"


@pytest.fixture(autouse=True)
def no_controller_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith(("DMLC_", "LAUNCHER_")) or name == "JOB_COMPLETION_INDEX":
            monkeypatch.delenv(name)


def settings(pod: int, workers: int, **knobs) -> XGBoostSettings:
    """What Trainer injects into pod ``pod`` of a TrainJob whose DMLC_NUM_WORKER is ``workers``."""
    return XGBoostSettings(tracker_uri=URI, tracker_port=29500, task_id=pod, num_worker=workers, **knobs)


def host(gpus: int = 0, cuda_visible_devices: str | None = None, cpus: int = 32, omp_set: bool = False) -> XGBoostFacts:
    """A faked node: ``gpus`` NVIDIA GPUs visible, ``cpus`` whole CPUs."""
    return XGBoostFacts(hostname="tj-node-0-1", gpu_count=gpus, cuda_visible_devices=cuda_visible_devices,
                        whole_cpus=cpus, omp_num_threads_set=omp_set, python="/usr/bin/python3",
                        runner=RUNNER, tracker_script=TRACKER)


PROGRAM = ("python", "train.py", "--rounds", "10")


def task_ids(plan) -> list[int]:
    return [worker.task_id for worker in plan.workers]


# --- G workers per GPU pod: the task ids Trainer does not give ------------------------------------

@pytest.mark.parametrize("pod, expected", [(0, [0, 1, 2, 3]), (1, [4, 5, 6, 7]), (2, [8, 9, 10, 11])])
def test_a_four_gpu_pod_runs_four_workers_with_task_ids_pod_times_four_plus_local(pod, expected):
    plan = plan_xgboost(settings(pod, 12), host(gpus=4), PROGRAM, {})
    assert plan.workers_per_pod == 4
    assert task_ids(plan) == expected
    assert [w.env_set["DMLC_TASK_ID"] for w in plan.workers] == [str(t) for t in expected]
    assert {w.env_set["DMLC_NUM_WORKER"] for w in plan.workers} == {"12"}  # the job's, unchanged
    assert [w.local_rank for w in plan.workers] == [0, 1, 2, 3]


def test_each_gpu_worker_sees_only_its_own_gpu():
    plan = plan_xgboost(settings(1, 8), host(gpus=4), PROGRAM, {})
    assert [w.env_set["CUDA_VISIBLE_DEVICES"] for w in plan.workers] == ["0", "1", "2", "3"]


def test_a_pod_with_a_narrowed_cuda_visible_devices_hands_out_those_devices():
    plan = plan_xgboost(settings(0, 4), host(gpus=2, cuda_visible_devices="GPU-aaa,GPU-bbb"), PROGRAM, {})
    assert [w.env_set["CUDA_VISIBLE_DEVICES"] for w in plan.workers] == ["GPU-aaa", "GPU-bbb"]


def test_gpu_workers_share_the_pods_cores_unless_omp_num_threads_is_set():
    plan = plan_xgboost(settings(0, 4), host(gpus=4, cpus=32), PROGRAM, {})
    assert {w.env_set["OMP_NUM_THREADS"] for w in plan.workers} == {"8"}
    plan = plan_xgboost(settings(0, 4), host(gpus=4, cpus=32, omp_set=True), PROGRAM, {})
    assert all("OMP_NUM_THREADS" not in w.env_set for w in plan.workers)


def test_a_cpu_pod_runs_one_worker_with_the_pods_task_id_and_every_core():
    plan = plan_xgboost(settings(2, 3), host(gpus=0), PROGRAM, {})
    assert task_ids(plan) == [2]
    (worker,) = plan.workers
    assert "CUDA_VISIBLE_DEVICES" not in worker.env_set and "OMP_NUM_THREADS" not in worker.env_set


def test_a_single_gpu_pod_keeps_its_gpu_visible_as_it_is():
    plan = plan_xgboost(settings(1, 2), host(gpus=1), PROGRAM, {})
    assert task_ids(plan) == [1]
    assert "CUDA_VISIBLE_DEVICES" not in plan.workers[0].env_set


def test_the_knob_sets_the_workers_per_pod_and_is_named_as_the_reason():
    plan = plan_xgboost(settings(1, 6, workers_per_pod=3), host(gpus=0), PROGRAM,
                        {"workers_per_pod": "--xgboost-workers-per-pod"})
    assert task_ids(plan) == [3, 4, 5]
    assert plan.workers_why == "--xgboost-workers-per-pod"


def test_a_worker_count_that_is_not_a_multiple_of_the_gpus_is_bad_input():
    with pytest.raises(ConfigError) as raised:
        plan_xgboost(settings(0, 6), host(gpus=4), PROGRAM, {})
    assert raised.value.name == "DMLC_NUM_WORKER" and "a multiple of the 4 workers" in str(raised.value)


def test_a_pod_index_beyond_what_the_worker_count_leaves_for_its_gpus_is_bad_input():
    with pytest.raises(ConfigError) as raised:
        plan_xgboost(settings(2, 8), host(gpus=4), PROGRAM, {"task_id": "JOB_COMPLETION_INDEX"})
    assert raised.value.name == "JOB_COMPLETION_INDEX"
    assert "from 0 to 1: DMLC_NUM_WORKER=8 is 2 pods x 4 workers" in str(raised.value)


# --- the tracker: where and by whom ----------------------------------------------------------------

def test_pod_0_runs_the_tracker_for_every_worker_of_the_job_before_its_own():
    plan = plan_xgboost(settings(0, 8), host(gpus=4), PROGRAM, {})
    assert plan.tracker_by == "launcher" and plan.runs_tracker
    assert plan.tracker_argv == ("python", TRACKER, "--workers", "8", "--port", "29500", "--host", "0.0.0.0")
    assert plan.connect is None  # its own tracker says when it listens
    assert plan.resolve == URI  # the workers reach it by the name Trainer gives


def test_other_pods_wait_for_the_trackers_name_and_port():
    plan = plan_xgboost(settings(1, 8), host(gpus=4), PROGRAM, {})
    assert not plan.runs_tracker
    assert plan.resolve == URI and plan.connect == (URI, 29500)


# --- restarts in place ----------------------------------------------------------------------------

def test_a_restart_moves_the_tracker_and_its_board_two_ports_a_generation_and_tells_the_workers():
    """Generation g's tracker is on 29500 + 2g and its stop board on the port after it: no tracker
    ever lands on an earlier generation's board (29501, 29503, ...)."""
    from launcher.xgboost.board import PORT_OFFSET

    pod_0, pod_1 = (plan_xgboost(settings(pod, 4), host(), PROGRAM, {}, generation=2) for pod in (0, 1))
    assert pod_0.tracker_port == pod_1.tracker_port == 29504
    assert pod_0.tracker_argv is not None and pod_0.tracker_argv[pod_0.tracker_argv.index("--port") + 1] == "29504"
    assert {w.env_set["DMLC_TRACKER_PORT"] for w in (*pod_0.workers, *pod_1.workers)} == {"29504"}
    assert pod_1.connect == (URI, 29504)
    boards = {g: plan_xgboost(settings(0, 4), host(), PROGRAM, {}, generation=g).tracker_port + PORT_OFFSET
              for g in range(4)}
    trackers = {plan_xgboost(settings(0, 4), host(), PROGRAM, {}, generation=g).tracker_port for g in range(4)}
    assert boards == {0: 29501, 1: 29503, 2: 29505, 3: 29507} and not trackers & set(boards.values())


def test_a_tracker_port_without_room_for_the_restarts_is_refused_naming_it_before_anything_starts():
    # the third start's tracker on 65534, its board on 65535
    plan_xgboost(XGBoostSettings(tracker_port=65530, num_worker=2), host(), PROGRAM, {}, restarts=2)
    with pytest.raises(ConfigError) as refused:
        plan_xgboost(XGBoostSettings(tracker_port=65531, num_worker=2), host(), PROGRAM, {}, restarts=2)
    assert str(refused.value) == (
        "DMLC_TRACKER_PORT='65531': expected a port with room for 2 restarts above it, 2 ports each (up to 65535)"
    )


def test_a_python_program_runs_through_the_runner_after_the_interpreters_own_options():
    plan = plan_xgboost(settings(1, 2), host(), ("python3", "-u", "-X", "dev", "train.py", "--lr", "3"), {})
    assert plan.runner
    assert plan.argv == ("python3", "-u", "-X", "dev", RUNNER, "train.py", "--lr", "3")
    plan = plan_xgboost(settings(1, 2), host(), ("python", "-m", "pkg.train", "x"), {})
    assert plan.argv == ("python", RUNNER, "-m", "pkg.train", "x")


def test_the_tracker_runs_on_the_programs_own_interpreter():
    plan = plan_xgboost(settings(0, 2), host(), ("/venv/bin/python", "train.py"), {})
    assert plan.tracker_argv[0] == "/venv/bin/python"


def test_a_command_that_is_not_python_runs_as_given_and_leaves_the_tracker_to_the_program():
    plan = plan_xgboost(settings(0, 4), host(gpus=2), ("bash", "-c", "python train.py"), {})
    assert plan.tracker_by == "program" and not plan.runs_tracker and not plan.runner
    assert plan.argv == ("bash", "-c", "python train.py")
    assert task_ids(plan) == [0, 1]  # the per-GPU task ids all the same


def test_program_mode_runs_a_python_program_as_given():
    plan = plan_xgboost(settings(0, 2, tracker="program"), host(), PROGRAM, {})
    assert plan.argv == PROGRAM and not plan.runs_tracker and not plan.runner


def test_launcher_mode_runs_the_tracker_even_for_a_shell_command():
    plan = plan_xgboost(settings(0, 2, tracker="launcher"), host(), ("bash", "-c", "python train.py"), {})
    assert plan.runs_tracker and not plan.runner
    assert plan.tracker_argv[0] == "/usr/bin/python3"  # the launcher's own interpreter
    assert "must not start a tracker" in plan.tracker_why


def test_an_ipv6_tracker_address_makes_the_tracker_listen_on_ipv6():
    plan = plan_xgboost(XGBoostSettings(tracker_uri="fd00::1", task_id=0, num_worker=2), host(), PROGRAM, {})
    assert plan.tracker_argv[-1] == "::"
    assert plan.resolve is None


def test_a_single_worker_job_without_a_tracker_address_uses_loopback():
    plan = plan_xgboost(XGBoostSettings(task_id=0, num_worker=1), host(), PROGRAM, {})
    assert plan.tracker_host == "127.0.0.1" and plan.runs_tracker


# --- the CLI's `plan` -------------------------------------------------------------------------------

def test_trainer_launcher_plan_prints_the_pods_workers_as_json():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "LAUNCHER_"))}
    env.update(PYTHONPATH=str(REPO), DMLC_TRACKER_URI=URI, DMLC_TRACKER_PORT="29500", DMLC_TASK_ID="1",
               DMLC_NUM_WORKER="6", LAUNCHER_XGBOOST_WORKERS_PER_POD="3")
    result = subprocess.run([sys.executable, "-m", "launcher", "plan", "--framework", "xgboost", "--",
                             "python", "train.py"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    assert printed["framework"] == "xgboost" and printed["podIndex"] == 1
    assert [w["taskId"] for w in printed["workers"]] == [3, 4, 5]
    assert printed["tracker"] == {**printed["tracker"], "address": f"{URI}:29500", "runBy": "launcher", "runsHere": False}
    assert printed["wait"] == {"resolve": URI, "connect": [URI, 29500]}
    assert printed["launcher"]["rendezvousTimeout"] == 600.0


def test_plan_imports_no_xgboost():
    code = ("import sys, runpy; sys.argv=['launcher','plan','--framework','xgboost']; "
            "import launcher.cli as c; c.main(sys.argv[1:]); assert 'xgboost' not in sys.modules, 'imported'")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "LAUNCHER_"))}
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**env, "PYTHONPATH": str(REPO)},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("restarts", [0, 2])
def test_local_picks_a_tracker_port_whose_neighbour_the_stop_board_needs_is_free_too(monkeypatch, restarts):
    """Pod 0's stop board listens on the tracker's port + 1. `local` used to pick one free port
    and leave its neighbour to chance: on a busy host (CI, seen once) the board could not listen,
    and each pod then reported its own view of the failure. Here the first free port the kernel
    offers has the last port the job may take after it taken, for real: a listening socket holds
    it (with restarts in place, each generation's tracker and board are two ports further on).
    Both ways `local` picks are steered: a random port below the ephemeral range, or the kernel's."""
    import random
    import socket

    from launcher.xgboost.local import tracker_port_for

    last = 2 * (restarts + 1) - 1  # the last generation's board, from the first tracker
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    taken = held.getsockname()[1]
    offers = iter([taken - last])
    real = socket.socket

    class FirstOfferNextToATakenPort(real):  # the kernel's choice for bind(port 0) is what is steered
        def bind(self, address):
            if address == ("127.0.0.1", 0) and (offer := next(offers, None)) is not None:
                address = ("127.0.0.1", offer)
            return super().bind(address)

    picks, pick = iter([taken - last]), random.SystemRandom.randrange

    def first_pick_next_to_a_taken_port(self, *bounds):
        return next(picks, None) or pick(self, *bounds)

    monkeypatch.setattr(socket, "socket", FirstOfferNextToATakenPort)
    monkeypatch.setattr(random.SystemRandom, "randrange", first_pick_next_to_a_taken_port)
    try:
        chosen = tracker_port_for(None, restarts)
    finally:
        held.close()
    assert chosen != taken - last
    monkeypatch.undo()
    for port in range(chosen + 1, chosen + last + 1):  # they were free when it was chosen
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", port))
    assert tracker_port_for("29500") == 29500  # the user's port is the user's
