"""torchtune's `tune run` through the launcher: the `tune` shim (images/shims/tune), the recipe
and config resolved as tune resolves them (launcher/torch/tune.py), the upstream command shapes
planned from the controller's PET_*, real runs of a stand-in recipe under real torchrun and gloo
(supervision, exit codes, the failing rank named), and the torchtune runtime against the
upstream CRD and the exit-code table.

No model is trained: tests/programs/tune_recipe.py is called the way tune calls a recipe
(``--config`` and ``key=value`` overrides) and does one all-reduce. torchtune itself is only read
(its recipe registry); the comparison with torchtune's own `tune run` imports it in a subprocess.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import k8s_checks
from conftest import REPO, assert_one_line_naming, clean_env, free_port, launcher, needs_root
from launcher.core import failure_policy
from launcher.core.outcome import DEFAULT_RETRYABLE_EXIT_CODES, ConfigError, is_retryable
from launcher.torch import args as torchrun_args
from launcher.torch import tune
from launcher.torch.tune import Recipe, Registry

SHIMS = REPO / "images" / "shims"
STAND_IN = REPO / "tests" / "programs" / "tune_recipe.py"
RUNTIME = REPO / "runtimes" / "torchtune-llama3.2-1b.yaml"
EXAMPLE = REPO / "examples" / "trainjob-torchtune.yaml"
TUNE_IMAGE = "ghcr.io/trainer-launcher/trainer-launcher-torchtune"
# Trainer v2.3 (pkg/constants): the config words the controller copies from the runtime's command.
IMMUTABLE_CONFIGS = ("output_dir", "tokenizer.path", "checkpointer.checkpoint_dir", "tokenizer.merges_file")
SUPPORTED_MODELS = ("llama3_2/1B", "llama3_2/3B", "llama3_3/70B", "qwen2_5/1.5B")

REGISTRY = tune.load_registry()
needs_torchtune = pytest.mark.skipif(REGISTRY is None, reason="torchtune is not installed (pip install torchtune)")


# --- resolution, pure ------------------------------------------------------------------------

FAKE = Registry("/site", (
    Recipe("full_finetune_distributed", "full_finetune_distributed.py",
           (("llama3_2/1B_full", "llama3_2/1B_full.yaml"),), True),
    Recipe("full_finetune_single_device", "full_finetune_single_device.py",
           (("llama3_2/1B_full_single_device", "llama3_2/1B_full_single_device.yaml"),), False),
    Recipe("lora_finetune_distributed", "lora_finetune_distributed.py",
           (("llama3_2/1B_lora", "llama3_2/1B_lora.yaml"),), True),
))


def test_a_builtin_recipe_with_torchrun_flags_runs_its_shipped_script_under_torchrun():
    run = tune.resolve(["--rdzv_endpoint=localhost:29500", "full_finetune_distributed", "--config", "llama3_2/1B_full",
                        "output_dir=/workspace/output"], FAKE, "python3")
    assert run.distributed and run.builtin and not run.module
    assert run.torchrun_args == ("--rdzv_endpoint=localhost:29500", "/site/recipes/full_finetune_distributed.py",
                                 "--config", "/site/recipes/configs/llama3_2/1B_full.yaml", "output_dir=/workspace/output")


def test_without_torchrun_flags_the_recipe_runs_as_one_process():
    run = tune.resolve(["full_finetune_single_device", "--config", "llama3_2/1B_full_single_device", "epochs=1"],
                       FAKE, "/venv/bin/python")
    assert not run.distributed and run.torchrun_args == ()
    assert run.command == ("/venv/bin/python", "-u", "/site/recipes/full_finetune_single_device.py", "--config",
                           "/site/recipes/configs/llama3_2/1B_full_single_device.yaml", "epochs=1")


def test_a_config_is_looked_up_among_every_recipes_configs_then_kept_as_a_path():
    other = tune.resolve(["--nnodes=1", "full_finetune_distributed", "--config", "llama3_2/1B_lora"], FAKE, "py")
    assert other.config_path == "/site/recipes/configs/llama3_2/1B_lora.yaml"
    path = tune.resolve(["--nnodes=1", "full_finetune_distributed", "--config", "mine.yaml"], FAKE, "py")
    assert path.config_path == "mine.yaml" and path.torchrun_args[-2:] == ("--config", "mine.yaml")


def test_a_recipe_path_runs_as_a_module_and_an_absolute_one_as_a_script():
    relative = tune.resolve(["--nproc_per_node", "2", "my_recipes/train.py", "--config", "c.yaml"], FAKE, "py")
    assert relative.module and relative.torchrun_args == (
        "--nproc_per_node", "2", "--module", "my_recipes.train", "--config", "c.yaml")
    alone = tune.resolve(["my_recipes/train.py", "--config", "c.yaml"], FAKE, "py")
    assert alone.command == ("py", "-u", "-m", "my_recipes.train", "--config", "c.yaml")
    absolute = tune.resolve(["--nnodes=1", "/opt/recipes/train.py", "--config", "c.yaml"], FAKE, "py")
    assert not absolute.module and absolute.torchrun_args[-3:] == ("/opt/recipes/train.py", "--config", "c.yaml")


def test_tune_decides_module_or_script_whatever_the_user_typed():
    run = tune.resolve(["-m", "--nproc-per-node=2", "full_finetune_distributed", "--config", "x.yaml"], FAKE, "py")
    assert "--module" not in run.torchrun_args and "-m" not in run.torchrun_args


def test_emulated_nodes_are_distributed_whatever_the_flags():
    run = tune.resolve(["full_finetune_distributed", "--config", "llama3_2/1B_full"], FAKE, "py", distributed=True)
    assert run.distributed and run.torchrun_args[0] == "/site/recipes/full_finetune_distributed.py"


@pytest.mark.parametrize("words, name, expected", [
    ([], "RECIPE", "a recipe name or path"),
    (["--nproc_per_node", "2"], "RECIPE", "a recipe name or path"),
    (["full_finetune_distributed"], "--config", "a config name or path"),
    (["full_finetune_distributed", "--config"], "--config", "a config name or path"),
    (["--nproc_per_node", "2", "full_finetune_single_device", "--config", "x"], "RECIPE", "supports distributed"),
    (["--nproc_per_node", "2", "--help", "full_finetune_distributed"], "tune run flag", "tune run --help"),
    (["--bogus", "1", "full_finetune_distributed", "--config", "x"], "torchrun flag",
         "torchrun: error: unrecognized arguments: --bogus"),
])
def test_bad_words_are_one_config_error_naming_what_is_wrong(words, name, expected):
    with pytest.raises(ConfigError) as raised:
        tune.resolve(words, FAKE, "py")
    assert raised.value.name == name and expected in str(raised.value)


def test_without_torchtune_a_recipe_name_is_refused_and_a_recipe_file_still_runs():
    with pytest.raises(ConfigError, match="pip install torchtune"):
        tune.resolve(["--nnodes=1", "full_finetune_distributed", "--config", "x"], None, "py")
    assert tune.resolve(["--nnodes=1", "r/train.py", "--config", "x"], None, "py").target == "r.train"


@needs_torchtune
def test_the_registry_is_read_without_importing_torchtune():
    code = ("import sys; from launcher.torch import tune; r = tune.load_registry(); "
            "print(len(r.recipes), 'torchtune' in sys.modules, 'torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(), check=True)
    count, torchtune_imported, torch_imported = result.stdout.split()
    assert int(count) > 10 and (torchtune_imported, torch_imported) == ("False", "False")


# --- the same meaning as torchtune's own `tune run` --------------------------------------------

_ORACLE = r"""
import json, runpy, sys
from unittest import mock
import torchtune._cli.run as tune_run
from torchtune._cli.tune import TuneCLIParser

seen = []
for words in json.loads(sys.argv[1]):
    got = {}
    def fake_run(a):
        got.update(distributed=True, target=a.training_script, module=a.module, args=list(a.training_script_args))
    def fake_path(path, run_name):
        got.update(distributed=False, target=path, module=False, args=sys.argv[1:])
    def fake_module(name, run_name):
        got.update(distributed=False, target=name, module=True, args=sys.argv[1:])
    sys.argv = ["tune", "run", *words]
    with mock.patch.object(tune_run, "run", fake_run), mock.patch.object(runpy, "run_path", fake_path), \
            mock.patch.object(runpy, "run_module", fake_module):
        parser = TuneCLIParser()
        parser.run(parser.parse_args())
    seen.append(got)
print("ORACLE " + json.dumps(seen))
"""
ORACLE_LINES = [
    ["--rdzv_endpoint=localhost:29500", "full_finetune_distributed", "--config", "llama3_2/1B_full", "output_dir=/o"],
    ["--rdzv_endpoint=tj-node-0-0.tj:29500", "full_finetune_distributed", "--config", "llama3_3/70B_full_multinode"],
    ["full_finetune_single_device", "--config", "llama3_2/1B_full_single_device", "epochs=1"],
    ["--nproc_per_node", "2", "lora_finetune_distributed", "--config", "qwen2_5/1.5B_lora", "model.lora_rank=16"],
    ["--nnodes=2", "my_recipes/train.py", "--config", "my/cfg.yaml", "x=1"],
    ["my_recipes/train.py", "--config", "llama3_2/1B_full"],
    ["--nproc-per-node=2", "-m", "full_finetune_distributed", "--config", "qwen2_5/1.5B_full"],
    ["--nproc_per_node", "2", "full_finetune_distributed", "--config", "x.yaml", "--config", "y"],
    ["--nn", "1", "--tee=3", "full_finetune_distributed", "--config", "llama3_2/3B_full", "--", "a=1"],
]


@needs_torchtune
def test_recipe_config_and_mode_are_what_torchtunes_own_tune_run_would_run():
    # tune's Run command with its torchrun call and runpy replaced by recorders; torchtune's import
    # needs a torchao it supports (0.18 removed what torchtune 0.6.1 imports).
    result = subprocess.run([sys.executable, "-c", _ORACLE, json.dumps(ORACLE_LINES)], capture_output=True, text=True,
                            env=clean_env(), timeout=240)
    if "ORACLE " not in result.stdout:
        pytest.skip(f"torchtune's own CLI does not import here: {result.stderr.strip().splitlines()[-1]}")
    seen = json.loads(result.stdout.split("ORACLE ", 1)[1])
    for words, theirs in zip(ORACLE_LINES, seen):
        ours = tune.resolve(words, REGISTRY, sys.executable)
        if ours.distributed:
            line = torchrun_args.read(list(ours.torchrun_args))
            mine = {"distributed": True, "target": line.program[0], "module": "module" in line.given,
                    "args": list(line.program[1:])}
        else:
            module = ours.command[2] == "-m"
            program = ours.command[3:] if module else ours.command[2:]
            mine = {"distributed": False, "target": program[0], "module": module, "args": list(program[1:])}
        assert mine == theirs, words


# --- the upstream command shapes, planned from the controller's PET_* -------------------------

def runtime() -> dict:
    return yaml.safe_load(RUNTIME.read_text())


def node_container(doc: dict) -> dict:
    (node,) = [j for j in doc["spec"]["template"]["spec"]["replicatedJobs"] if j["name"] == "node"]
    (container,) = node["template"]["spec"]["template"]["spec"]["containers"]
    return container


def controller(doc: dict, trainjob: str, num_nodes: int, num_proc_per_node: int | None, gpus: int,
               args: list[str], runtime_name: str | None = None) -> tuple[list[str], dict[str, str]]:
    """What Trainer v2.3's torch plugin gives a TrainJob whose `command` is `[tune, run]`
    (pkg/runtime/framework/plugins/torch): the command it completes, and the node's PET_* (no
    PET_MASTER_*: torchtune gets the endpoint on the command line). ``node_rank`` is added per pod."""
    name = runtime_name or doc["metadata"]["name"]
    fields = name.split("-")
    model = f"{fields[1].replace('.', '_')}/{fields[2].upper()}"
    nproc = "auto" if num_proc_per_node is None else num_proc_per_node
    words = []
    if num_nodes > 1 or (nproc != "auto" and nproc > 1) or (nproc == "auto" and gpus > 1):
        words.append(f"--rdzv_endpoint={trainjob}-node-0-0.{trainjob}:29500")
    if num_nodes == 1 and (nproc == 1 or gpus == 1):
        recipe, suffix = "full_finetune_single_device", "_full_single_device"
    else:
        recipe, suffix = "full_finetune_distributed", "_full_multinode" if num_nodes > 1 else "_full"
    words += [recipe, "--config", model + suffix]
    words += [w for w in node_container(doc)["command"] if w.split("=")[0] in IMMUTABLE_CONFIGS]
    env = {"PET_NNODES": str(num_nodes), "PET_NPROC_PER_NODE": str(nproc)}
    return ["tune", "run", *words, *args], env


def plan(words: list[str], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(launcher("plan", "--tune", "--", *words), capture_output=True, text=True,
                          env=clean_env(**env), timeout=60)


def planned(words: list[str], **env: str) -> dict:
    result = plan(words, **env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def recipes_dir() -> str:
    return os.path.join(REGISTRY.root, "recipes")


@needs_torchtune
def test_the_runtimes_own_command_plans_one_node_on_its_local_store():
    # A TrainJob without `command`: the runtime's words as they are, with the torch policy's
    # PET_* including the master that torchtune's endpoint overrides.
    command = node_container(runtime())["command"]
    assert command[:2] == ["tune", "run"]
    document = planned(command[2:], PET_NNODES="1", PET_NPROC_PER_NODE="auto", PET_NODE_RANK="0",
                       PET_MASTER_ADDR="tj-node-0-0.tj", PET_MASTER_PORT="29500")
    assert (document["mode"], document["nnodes"], document["nodeRank"]) == ("static", "1", 0)
    argv = document["argv"]
    assert argv[argv.index("--rdzv-endpoint") + 1] == "localhost:29500"
    assert argv[argv.index("--rdzv-endpoint") + 2:] == [
        os.path.join(recipes_dir(), "full_finetune_distributed.py"),
        "--config", os.path.join(recipes_dir(), "configs", "llama3_2", "1B_full.yaml"), *command[6:]]
    assert document["sources"]["nproc_per_node"].startswith("PET_NPROC_PER_NODE=auto")
    assert document["tune"]["builtin"] and document["tune"]["config"] == "llama3_2/1B_full"


@needs_torchtune
@pytest.mark.parametrize("node_rank", [0, 1])
def test_the_controllers_multi_node_command_plans_a_static_rendezvous_on_node_0(node_rank):
    # The one model upstream lets run on several nodes; its config is the _full_multinode one.
    command, env = controller(runtime(), "tj", 2, 4, 4, ["epochs=1"], runtime_name="torchtune-llama3.3-70b")
    assert command[2] == "--rdzv_endpoint=tj-node-0-0.tj:29500"
    document = planned(command[2:], **env, PET_NODE_RANK=str(node_rank))
    assert (document["mode"], document["nnodes"], document["nprocPerNode"], document["nodeRank"]) == (
        "static", "2", 4, node_rank)
    assert document["wait"]["store"] == "tj-node-0-0.tj:29500"
    # Node 0 serves the store; node 1 waits for it before torchrun starts.
    assert document["wait"]["connect"] == (None if node_rank == 0 else "tj-node-0-0.tj:29500")
    argv = document["argv"]
    script = argv.index(os.path.join(recipes_dir(), "full_finetune_distributed.py"))
    assert argv[script + 1:] == ["--config", os.path.join(recipes_dir(), "configs", "llama3_3", "70B_full_multinode.yaml"),
                                 "output_dir=/workspace/output", "tokenizer.path=/workspace/model/original/tokenizer.model",
                                 "checkpointer.checkpoint_dir=/workspace/model", "epochs=1"]


@needs_torchtune
def test_the_controllers_one_gpu_command_plans_one_supervised_process():
    command, env = controller(runtime(), "tj", 1, None, 1, [])
    assert command[2] == "full_finetune_single_device"  # no endpoint: no torchrun flag at all
    document = planned(command[2:], **env, PET_NODE_RANK="0")
    assert document["mode"] == "single-device"
    assert document["argv"][1:4] == ["-u", os.path.join(recipes_dir(), "full_finetune_single_device.py"), "--config"]
    assert document["argv"][4] == os.path.join(recipes_dir(), "configs", "llama3_2", "1B_full_single_device.yaml")


@needs_torchtune
def test_the_controllers_one_node_multi_gpu_command_plans_every_gpu_on_one_node():
    command, env = controller(runtime(), "tj", 1, None, 2, ["epochs=1"])
    document = planned(command[2:], **env, PET_NODE_RANK="0")
    assert (document["mode"], document["nnodes"]) == ("static", "1")
    assert document["tune"]["configPath"].endswith("llama3_2/1B_full.yaml")


@pytest.mark.parametrize("words, names, value", [
    (["full_finetune_distributed"], "--config", None),
    (["--nproc_per_node", "two", "r/x.py", "--config", "c"], "--nproc_per_node", "two"),
    (["--max-restarts=x", "r/x.py", "--config", "c"], "--max-restarts", "x"),
])
def test_bad_tune_words_are_one_line_and_exit_2(words, names, value):
    assert_one_line_naming(plan(words), names, value)


# --- the shim -------------------------------------------------------------------------------

def test_the_shim_sends_tune_run_to_the_launcher_and_everything_else_to_torchtune(tmp_path):
    # images/shims/tune against a trainer-launcher and a python3 that print their arguments.
    for program in ("trainer-launcher", "python3"):
        fake = tmp_path / program
        fake.write_text(f'#!/bin/sh\necho {program} "shim=${{TRAINER_LAUNCHER_SHIM:-unset}}" "$@"\n')
        fake.chmod(0o755)

    def shim(*argv: str, **env: str) -> str:
        return subprocess.run([str(SHIMS / "tune"), *argv], capture_output=True, text=True, check=True,
                              env={"PATH": f"{tmp_path}:/usr/bin:/bin", **env}).stdout.strip()

    assert shim("run", "--nnodes=1", "r.py", "--config", "c") == \
        "trainer-launcher shim=off torch --tune -- --nnodes=1 r.py --config c"
    assert shim("run", "full_finetune_distributed", "--config", "c") == \
        "trainer-launcher shim=off torch --tune -- full_finetune_distributed --config c"
    for own in (["ls"], ["download", "meta-llama/x"], ["run"], ["run", "--help"], ["run", "-h"], ["--help"], []):
        assert shim(*own) == " ".join(["python3", "shim=unset", "-m", "torchtune._cli.tune", *own]), own
    assert shim("run", "r.py", TRAINER_LAUNCHER_SHIM="off").startswith("python3 shim=off -m torchtune._cli.tune run")


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="needs shellcheck (.ci/install-containers installs it)")
def test_the_shim_passes_shellcheck():
    result = subprocess.run(["shellcheck", "--shell=sh", str(SHIMS / "tune")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


# --- real runs: `tune run` through the shim, the launcher, torchrun and gloo -----------------

def recipe_dir(tmp_path: Path) -> tuple[Path, Path]:
    """A working directory with the stand-in as a recipe file (tune runs it as module
    my_recipes.stand_in), a config and an output directory."""
    work = tmp_path / "work"
    (work / "my_recipes").mkdir(parents=True)
    shutil.copy(STAND_IN, work / "my_recipes" / "stand_in.py")
    output = tmp_path / "output"
    output.mkdir()
    (work / "config.yaml").write_text(yaml.safe_dump({"output_dir": str(output), "lr": 0.1}))
    return work, output


def shim_env(tmp_path: Path, name: str, **env: str) -> dict[str, str]:
    venv_bin = str(Path(sys.executable).parent)
    return clean_env(PATH=f"{SHIMS}:{venv_bin}:{os.environ['PATH']}", LAUNCHER_GRACE_PERIOD="5",
                     LAUNCHER_TERMINATION_LOG=str(tmp_path / f"{name}.termination.json"), **env)


def tune_run(tmp_path: Path, work: Path, words: list[str], name: str = "node", **env: str) -> subprocess.Popen:
    with open(tmp_path / f"{name}.err", "wb") as err:
        return subprocess.Popen(["tune", "run", *words], cwd=work, env=shim_env(tmp_path, name, **env),
                                stdout=subprocess.DEVNULL, stderr=err)


def finished(process: subprocess.Popen, tmp_path: Path, name: str = "node") -> tuple[int, str, dict | None]:
    code = process.wait(timeout=180)
    termination = tmp_path / f"{name}.termination.json"
    message = json.loads(termination.read_text()) if termination.exists() else None
    return code, (tmp_path / f"{name}.err").read_text(errors="replace"), message


def reports(output: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(output.glob("*.json"))]


def test_tune_run_with_torchrun_flags_runs_the_recipe_on_two_gloo_ranks(tmp_path):
    work, output = recipe_dir(tmp_path)
    code, err, message = finished(tune_run(tmp_path, work, [
        "--nproc_per_node", "2", "my_recipes/stand_in.py", "--config", "config.yaml", "lr=0.5"]), tmp_path)
    assert code == 0, err[-3000:]
    assert "trainer-launcher: torch: standalone rendezvous" in err
    assert "--module my_recipes.stand_in --config config.yaml lr=0.5" in err  # what tune would run
    ranks = reports(output)
    assert [(r["rank"], r["world_size"], r["allreduce"]) for r in ranks] == [(0, 2, 3.0), (1, 2, 3.0)]
    assert {r["config"]["lr"] for r in ranks} == {0.5}  # the override reached the recipe
    assert message["exitCode"] == 0


def test_a_failing_rank_ends_the_run_with_its_own_exit_code_and_is_named(tmp_path):
    # Plain `tune run` (torchrun) would exit 1 and name nobody.
    work, output = recipe_dir(tmp_path)
    code, err, message = finished(tune_run(tmp_path, work, [
        "--nproc_per_node", "2", "my_recipes/stand_in.py", "--config", "config.yaml",
        "fail_rank=1", "exit_code=3", "others_wait=sleep"]), tmp_path)
    assert code == 3, err[-3000:]
    assert (message["retryable"], message["rootCause"]["rank"], message["rootCause"]["exitCode"]) == (False, 1, 3)
    assert "rank 1 (local rank 1)" in err.strip().splitlines()[-1]
    assert len(reports(output)) == 2  # rank 0 ran, and was stopped well before its 300 s sleep


def test_a_failing_rank_keeps_its_code_while_the_others_wait_in_a_collective(tmp_path):
    # What a real recipe does: the other ranks sit in the next collective when one rank dies, and
    # gloo tells them their peer closed the connection.
    work, _ = recipe_dir(tmp_path)
    code, err, message = finished(tune_run(tmp_path, work, [
        "--nproc_per_node", "2", "my_recipes/stand_in.py", "--config", "config.yaml",
        "fail_rank=1", "exit_code=3"]), tmp_path)
    assert (code, message["rootCause"]["rank"], message["retryable"]) == (3, 1, False), err[-2000:]


def test_the_controllers_two_node_shape_fails_as_one_job_naming_the_rank(tmp_path):
    # Two pods, each `tune run --rdzv_endpoint=<master>:<port> RECIPE --config ...` with the
    # controller's PET_NNODES/PET_NPROC_PER_NODE/PET_NODE_RANK and no PET_MASTER_*.
    work, output = recipe_dir(tmp_path)
    port = free_port()
    words = [f"--rdzv_endpoint=127.0.0.1:{port}", "my_recipes/stand_in.py", "--config", "config.yaml",
             "fail_rank=1", "exit_code=3", "others_wait=sleep"]
    nodes = [tune_run(tmp_path, work, words, f"node{rank}", PET_NNODES="2", PET_NPROC_PER_NODE="1",
                      PET_NODE_RANK=str(rank), HOSTNAME=f"tj-node-0-{rank}") for rank in (1, 0)][::-1]
    results = [finished(node, tmp_path, f"node{rank}") for rank, node in enumerate(nodes)]
    assert [code for code, _, _ in results] == [3, 3], "\n".join(err[-2000:] for _, err, _ in results)
    for code, err, message in results:
        assert (message["rootCause"]["node"], message["rootCause"]["rank"], message["exitCode"]) == ("tj-node-0-1", 1, 3)
    assert results[0][2]["reason"] == "PeerFailed"
    assert len(reports(output)) == 2


def test_without_torchrun_flags_the_recipe_runs_supervised_as_one_process(tmp_path):
    work, output = recipe_dir(tmp_path)
    code, err, message = finished(tune_run(tmp_path, work, [
        "my_recipes/stand_in.py", "--config", "config.yaml", "fail_rank=0", "exit_code=4"]), tmp_path)
    assert code == 4, err[-3000:]
    (report,) = reports(output)
    assert (report["distributed"], report["world_size"]) == (False, 1)  # no torchrun, as with tune
    assert message["exitCode"] == 4 and message["retryable"] is False


@needs_root
def test_local_emulates_a_two_node_torchtune_trainjob(tmp_path):
    # `local --tune`: two pods with their own hostnames and /etc/hosts, the controller's PET_*.
    work, output = recipe_dir(tmp_path)
    result = subprocess.run(launcher("local", "--tune", "--nnodes", "2", "--trainjob", "tj", "--",
                                     "my_recipes/stand_in.py", "--config", "config.yaml"),
                            cwd=work, capture_output=True, text=True, timeout=240, env=clean_env())
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = reports(output)
    assert [(r["rank"], r["world_size"], r["allreduce"]) for r in ranks] == [(0, 2, 3.0), (1, 2, 3.0)]


# --- the runtime ---------------------------------------------------------------------------

needs_crd = pytest.mark.skipif(not k8s_checks.CLUSTER_RUNTIME_CRD.exists(),
                               reason=f"the upstream CRDs are not beside the checkout ({k8s_checks.CRD_DIR})")


@needs_crd
def test_the_runtime_is_accepted_by_the_upstream_crd_its_cel_rules_and_the_jobset_webhook():
    assert k8s_checks.validate_runtime(runtime()) == []


@needs_crd
@pytest.mark.parametrize("version", ["1.31", "1.37"])
def test_the_runtimes_jobs_and_claims_are_valid_core_objects(version):
    doc = runtime()
    objects = k8s_checks.embedded_jobs(doc) + k8s_checks.embedded_claims(doc)
    assert [e for obj in objects for e in k8s_checks.core_errors(obj, version)] == []


def test_the_runtimes_failure_policy_is_the_one_derived_from_the_exit_code_table():
    doc = runtime()
    spec = doc["spec"]["template"]["spec"]
    assert spec["failurePolicy"] == failure_policy.jobset_failure_policy()
    for rjob in spec["replicatedJobs"]:
        expected = failure_policy.job_policy(rjob["name"])
        job = rjob["template"]["spec"]
        assert (job["backoffLimit"], job["podFailurePolicy"]) == (expected["backoffLimit"], expected["podFailurePolicy"])
        assert job["template"]["spec"]["restartPolicy"] == "Never"
        # Every code the launcher calls retryable is tolerated; every other failure fails the Job.
        (rule,) = [r for r in job["podFailurePolicy"]["rules"] if "onExitCodes" in r]
        for code in range(1, 256):
            fails_job = code not in rule["onExitCodes"]["values"]
            assert fails_job != is_retryable(code, DEFAULT_RETRYABLE_EXIT_CODES), (rjob["name"], code)


def test_the_runtime_has_upstreams_shape_for_the_sdk_and_the_controller():
    doc = runtime()
    name = doc["metadata"]["name"]
    assert doc["metadata"]["labels"]["trainer.kubeflow.org/framework"] == "torchtune"
    # The controller reads the model from the name: torchtune-<model>-<size>.
    fields = name.split("-")
    assert len(fields) == 3 and f"{fields[1].replace('.', '_')}/{fields[2].upper()}" in SUPPORTED_MODELS
    jobs = {j["name"]: j for j in doc["spec"]["template"]["spec"]["replicatedJobs"]}
    assert list(jobs) == ["dataset-initializer", "model-initializer", "node"]
    assert jobs["node"]["dependsOn"] == [{"name": "dataset-initializer", "status": "Complete"},
                                         {"name": "model-initializer", "status": "Complete"}]
    node = node_container(doc)
    assert node["name"] == "node" and node["image"] == f"{TUNE_IMAGE}:0.1.0"
    command = node["command"]
    assert command[:3] == ["tune", "run", "--rdzv_endpoint=localhost:29500"]
    # The controller copies these into a `[tune, run]` TrainJob's command; they must be here.
    assert {w.split("=")[0] for w in command if "=" in w} >= {"output_dir", "tokenizer.path", "checkpointer.checkpoint_dir"}
    for rjob_name in ("dataset-initializer", "model-initializer"):
        (container,) = jobs[rjob_name]["template"]["spec"]["template"]["spec"]["containers"]
        assert container["command"] == ["trainer-launcher", "init", rjob_name.split("-")[0]]
        assert {"name": "initializer", "mountPath": "/workspace"} in container["volumeMounts"]
    pod = jobs["node"]["template"]["spec"]["template"]["spec"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in pod["volumes"]


def test_the_kustomization_ships_the_runtime_and_its_image():
    kustomization = yaml.safe_load((REPO / "runtimes" / "kustomization.yml").read_text())
    assert RUNTIME.name in kustomization["resources"]
    assert {"name": TUNE_IMAGE, "newTag": "0.1.0"} in kustomization["images"]


@needs_crd
def test_the_example_trainjob_is_accepted_and_names_the_runtime():
    doc = yaml.safe_load(EXAMPLE.read_text())
    schema = k8s_checks.openapi_schema(k8s_checks.CRD_DIR / "trainer.kubeflow.org_trainjobs.yaml")
    defaulted = k8s_checks.with_defaults(doc, schema)
    errors = k8s_checks.schema_errors(defaulted, schema) + k8s_checks.metadata_errors(doc, cluster_scoped=False)
    assert (errors or k8s_checks.cel_errors(defaulted, schema)) == []
    assert doc["spec"]["runtimeRef"]["name"] == runtime()["metadata"]["name"]
    # Exactly what the controller rewrites for torchtune (`[tune, run]`), and nothing immutable in args.
    assert doc["spec"]["trainer"]["command"] == ["tune", "run"]
    assert not [a for a in doc["spec"]["trainer"]["args"] if a.split("=")[0] in IMMUTABLE_CONFIGS]
