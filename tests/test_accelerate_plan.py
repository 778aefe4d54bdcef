"""The accelerate line's translation (launcher/torch/accelerate_launch.py), pure: Accelerate's
reading (what accelerate_read.py reports) and the node count from PET_* -> the torchrun words
``trainer-launcher torch`` plans from. The reading itself, by real accelerate, is in
tests/test_accelerate.py."""

from __future__ import annotations

import pytest

from launcher.core.outcome import ConfigError
from launcher.torch import args as torchrun_args
from launcher.torch.accelerate_launch import RUNNER, Given, Reading, translate


def reading(given: dict[str, tuple[object, str]] | None = None, mode: str = "multi_gpu", **program) -> Reading:
    return Reading("1.15.0", mode, None, {dest: Given(*item) for dest, item in (given or {}).items()},
                   {"ACCELERATE_MIXED_PRECISION": "no"}, program.get("script", "train.py"),
                   tuple(program.get("args", ())), program.get("module", False), program.get("no_python", False))


def words(given=None, nnodes: int = 2, mode: str = "multi_gpu", **program) -> list[str]:
    return list(translate(reading(given, mode, **program), nnodes).torchrun_args)


def test_nothing_set_leaves_the_whole_world_to_pet():
    assert words() == ["train.py"]


def test_num_processes_is_the_jobs_total_divided_over_the_nodes():
    assert words({"num_processes": (8, "--num_processes")}, nnodes=2) == ["--nproc-per-node", "4", "train.py"]
    assert words({"num_processes": (8, "--num_processes"), "num_machines": (4, "--num_machines")}, nnodes=2) == [
        "--nnodes", "4", "--nproc-per-node", "2", "train.py"]


def test_a_total_that_does_not_divide_is_refused_naming_where_it_came_from():
    with pytest.raises(ConfigError) as raised:
        words({"num_processes": (3, "num_processes in cfg.yaml")}, nnodes=2)
    assert str(raised.value).startswith("num_processes in cfg.yaml='3': expected a multiple of the node count 2")


def test_a_typed_machine_rank_is_kept_and_a_config_files_is_left_to_the_pod():
    assert words({"machine_rank": (1, "--machine_rank")}) == ["--node-rank", "1", "train.py"]
    translation = translate(reading({"machine_rank": (0, "machine_rank in cfg.yaml")}), 2)
    assert list(translation.torchrun_args) == ["train.py"]
    assert "machine_rank in cfg.yaml left out" in translation.notes[0]


def test_master_and_torchrun_options_keep_their_meaning():
    assert words({"main_process_ip": ("10.0.0.5", "--main_process_ip"), "main_process_port": (29612, "--main_process_port"),
                  "rdzv_backend": ("c10d", "--rdzv_backend"), "max_restarts": (2, "--max_restarts"),
                  "tee": ("3", "--tee")}) == [
        "--master-addr", "10.0.0.5", "--master-port", "29612", "--rdzv-backend", "c10d", "--max-restarts", "2",
        "--tee", "3", "train.py"]


def test_port_zero_is_a_free_port_on_one_node_and_refused_on_several():
    assert words({"main_process_port": (0, "--main_process_port")}, nnodes=1) == ["--standalone", "train.py"]
    with pytest.raises(ConfigError, match="main_process_port='0'"):
        words({"main_process_port": (0, "--main_process_port")}, nnodes=2)


def test_module_no_python_and_awkward_arguments_read_back_as_the_program():
    translated = words(script="pkg.train", args=("--lr", "1"), module=True)
    assert translated[0] == "--module"
    assert torchrun_args.read(translated).program == ("pkg.train", "--lr", "1")
    translated = words(script="-weird.py", args=("--nnodes", "9"))
    assert torchrun_args.read(translated).program == ("-weird.py", "--nnodes", "9")
    assert words(script="./run.sh", no_python=True) == ["--no-python", "./run.sh"]


def test_on_cpu_a_python_program_runs_through_the_runner_that_has_partial_state_read_use_cpu():
    assert words({"num_processes": (2, "--num_processes")}, mode="cpu") == ["--nproc-per-node", "1", RUNNER, "train.py"]
    translated = words(script="pkg.train", args=("--lr", "1"), module=True, mode="cpu")
    assert "--module" not in translated  # the runner runs the module: torchrun starts the runner
    assert torchrun_args.read(translated).program == (RUNNER, "-m", "pkg.train", "--lr", "1")
    translated = words(script="-weird.py", args=("--nnodes", "9"), mode="cpu")
    assert torchrun_args.read(translated).program == (RUNNER, "--", "-weird.py", "--nnodes", "9")
    assert words(script="./run.sh", no_python=True, mode="cpu") == ["--no-python", "./run.sh"]


def test_no_python_on_cpu_warns_where_partial_state_alone_would_see_a_world_of_one():
    import dataclasses

    line = reading(mode="cpu", script="./run.sh", no_python=True)
    assert any(note.startswith("--no_python: ./run.sh does not run through") for note in translate(line, 2).notes)
    assert translate(dataclasses.replace(line, version="1.12.0"), 2).notes == ()  # it finds the world itself


def test_accelerates_variables_reach_the_ranks():
    assert translate(reading(), 2).env == {"ACCELERATE_MIXED_PRECISION": "no"}


def test_the_reader_reports_exactly_the_torchrun_options_the_translation_maps():
    import importlib.util

    from launcher.torch.accelerate_launch import READER, TORCHRUN

    spec = importlib.util.spec_from_file_location("_accelerate_read_plan_test", READER)
    reader = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reader)
    assert set(reader.TORCHRUN) == set(TORCHRUN)
