"""``accelerate launch`` under Trainer, with the real accelerate on CPU: the images' ``accelerate``
shim and ``trainer-launcher torch|local|plan --accelerate`` (launcher/torch/accelerate_launch.py).

The real jobs (two pods under Trainer's env through the shim, a failing process under ``local``)
are in tests/test_matrix_accelerate.py, on the oldest and the newest accelerate. The program
(tests/programs/accelerate_train.py) trains a small model through
``Accelerator.prepare`` on different data in every process: equal parameters on every process
afterwards mean the gradients were averaged across the whole world.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import accelerate_table
from conftest import REPO, clean_env, free_port
from launcher.torch.accelerate_launch import READER, RUNNER, Reading, translate
from launcher.torch.plan import split_torchrun_args

pytest.importorskip("accelerate")
TRAIN = str(REPO / "tests" / "programs" / "accelerate_train.py")
SHIM = str(REPO / "images" / "shims" / "accelerate")
CONFIG = accelerate_table.CONFIG


def assert_one_world(reports: dict[int, dict], world: int) -> None:
    assert sorted(reports) == list(range(world)), reports
    assert {r["world"] for r in reports.values()} == {world}
    assert {r["reduced"] for r in reports.values()} == {world * (world + 1) / 2}  # every process in one group
    assert {r["type"] for r in reports.values()} == {"DistributedType.MULTI_CPU"}
    checksums = {r["checksum"] for r in reports.values()}
    assert len(checksums) == 1, reports  # gradients averaged across every process
    assert checksums != {r["initial"] for r in reports.values()}  # and the model trained


@pytest.mark.parametrize("line, name, value", [
    ("--num_processes 3 train.py", "--num_processes", "3"),
    ("--tpu train.py", "--tpu", "True"),
    ("--no_such_flag train.py", "accelerate launch", "--no_such_flag train.py"),
    ("--config_file /nonexistent.yaml train.py", "accelerate config", "/nonexistent.yaml"),
    ("--module --no_python train", "--module", "True"),
])
def test_a_bad_line_is_one_line_naming_it_and_exit_2(line, name, value):
    result = accelerate_table.plan(line)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"trainer-launcher: error: {name}={value!r}: expected "), lines


@pytest.fixture(scope="module")
def read_here_in_process():
    """accelerate_read.read in this process (one torch import for every row), under the env
    of pod 1 of the table's TrainJob; the CLI path is the same function behind a subprocess."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_accelerate_read_under_test", READER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    saved, cwd = dict(os.environ), os.getcwd()
    os.environ.update(accelerate_table.TRAINER_ENV)
    os.chdir(REPO)  # the table's config file path is relative to the checkout
    try:
        yield module.read
    finally:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(saved)


@pytest.mark.parametrize("line, world", accelerate_table.LINES, ids=[line for line, _ in accelerate_table.LINES])
def test_the_comparison_table_row(line, world, read_here_in_process):
    """Each row of the table in docs/frameworks/accelerate.md (generated through `plan` by
    python -m tests.accelerate_table):
    the world we run under Trainer's env, the user's setting where there is one, PET_* elsewhere;
    Accelerate alone never forms that world on a CPU pod."""
    reading = Reading.from_json(read_here_in_process(line.split(), say=lambda _: None))
    translated = translate(reading, int(accelerate_table.TRAINER_ENV["PET_NNODES"]))
    given = split_torchrun_args(list(translated.torchrun_args)).overrides
    nodes = int(given["nnodes"].value) if "nnodes" in given else int(accelerate_table.TRAINER_ENV["PET_NNODES"])
    nproc = int(given["nproc_per_node"].value) if "nproc_per_node" in given else int(
        accelerate_table.TRAINER_ENV["PET_NPROC_PER_NODE"])
    assert (nodes, nproc) == world, translated
    assert "node_rank" not in given or given["node_rank"].value == "1"  # the pod's own rank
    alone = reading.alone
    assert alone.get("error") or alone["world"] != world[0] * world[1] or alone["machines"] == 1, alone


@pytest.mark.parametrize("line, mode, expected", [
    ("--use_fsdp --fsdp_sharding_strategy SHARD_GRAD_OP --fsdp_offload_params true train.py", "fsdp",
     {"ACCELERATE_USE_FSDP": "true", "FSDP_SHARDING_STRATEGY": "SHARD_GRAD_OP", "FSDP_OFFLOAD_PARAMS": "true"}),
    ("--use_deepspeed --zero_stage 2 --gradient_accumulation_steps 4 train.py", "deepspeed",
     {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "2",
      "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "4"}),
    ("--cpu --dynamo_backend inductor --mixed_precision bf16 train.py", "cpu",
     {"ACCELERATE_DYNAMO_BACKEND": "INDUCTOR", "ACCELERATE_MIXED_PRECISION": "bf16", "ACCELERATE_USE_CPU": "True"}),
])
def test_accelerates_own_code_computes_the_ranks_variables(line, mode, expected, read_here_in_process):
    """FSDP, DeepSpeed, dynamo and mixed precision as Accelerate itself sets them for its ranks."""
    reading = Reading.from_json(read_here_in_process(line.split(), say=lambda _: None))
    assert reading.mode == mode
    assert {name: reading.env.get(name) for name in expected} == expected
    assert "MASTER_ADDR" not in reading.env and "MASTER_PORT" not in reading.env  # torchrun's to set


@pytest.mark.parametrize("use_cpu, seen", [("True", "MULTI_CPU"), (None, "NO")])
def test_the_cpu_runner_has_partial_state_read_accelerate_use_cpu(use_cpu, seen):
    """A process of a world of one as torchrun starts it, its program run through accelerate_run.py:
    PartialState() alone forms the gloo world where ACCELERATE_USE_CPU says so, as Accelerator()
    does, and is left alone otherwise; accelerate is not imported before the program imports it."""
    code = ("import sys; early = 'accelerate' in sys.modules\n"
            "from accelerate import PartialState\n"
            "print(early, PartialState().distributed_type, sys.argv)")
    env = clean_env(LOCAL_RANK="0", RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=str(free_port()))
    env.pop("ACCELERATE_USE_CPU", None)
    env.update({"ACCELERATE_USE_CPU": use_cpu} if use_cpu else {})
    result = subprocess.run([sys.executable, RUNNER, "-c", code, "--lr", "1"], env=env, capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"False DistributedType.{seen} ['-c', '--lr', '1']", result.stdout + result.stderr


def test_the_shim_leaves_accelerates_other_commands_to_accelerate(tmp_path):
    env = clean_env(PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    result = subprocess.run(["sh", SHIM, "env"], env=env, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0 and "`Accelerate` version" in result.stdout, result.stdout + result.stderr
    result = subprocess.run(["sh", SHIM, "launch", "--help"], env=env, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0 and "--num_processes" in result.stdout, result.stderr


def test_plan_shows_the_translated_line(tmp_path):
    result = accelerate_table.plan(f"--config_file {CONFIG} --mixed_precision no train.py --lr 1")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    shown = document["accelerate"]
    assert shown["argv"][:2] == ["accelerate", "launch"]
    assert shown["given"]["num_processes"] == {"value": 4, "from": f"num_processes in {CONFIG}"}
    assert shown["env"]["ACCELERATE_MIXED_PRECISION"] == "no" and shown["env"]["ACCELERATE_USE_CPU"] == "True"
    assert document["argv"][-3:] == ["train.py", "--lr", "1"]
    assert "--nproc-per-node" in document["argv"] and document["nprocPerNode"] == 2


def test_a_run_that_ends_before_its_plan_leaves_no_reader_behind(tmp_path):
    """A bad launcher variable ends the run before the reading is asked for: the reader, started at
    once beside the torch agent, goes with it (the supervisor's teardown kills every descendant)."""
    import psutil

    script = str(tmp_path / "no-reader-left-behind.py")
    result = subprocess.run([sys.executable, "-m", "launcher", "torch", "--accelerate", "--", script],
                            env=clean_env(LAUNCHER_GRACE_PERIOD="soon"), capture_output=True, text=True, timeout=120,
                            check=False)
    assert result.returncode == 2 and "LAUNCHER_GRACE_PERIOD" in result.stderr, result.stderr
    left = [p.pid for p in psutil.process_iter(["cmdline"]) if script in (p.info["cmdline"] or [])]
    assert left == [], left
