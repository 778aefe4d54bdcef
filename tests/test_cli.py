"""The command line as a user meets it: plan output, version, and a start that stays light."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import REPO, clean_env, launcher


def test_plan_prints_the_torchrun_command_a_trainer_node_would_run():
    env = clean_env(PET_NNODES="4", PET_NODE_RANK="3", PET_NPROC_PER_NODE="2",
                    PET_MASTER_ADDR="tj-node-0-0.tj", PET_MASTER_PORT="29500")
    result = subprocess.run(launcher("plan", "--", "train.py", "--lr", "0.1"), env=env, cwd=REPO,
                            capture_output=True, text=True, check=True)
    plan = json.loads(result.stdout)
    assert plan["argv"] == ["torchrun", "--nnodes", "4", "--nproc-per-node", "2", "--node-rank", "3",
                            "--rdzv-backend", "static", "--master-addr", "tj-node-0-0.tj",
                            "--master-port", "29500", "train.py", "--lr", "0.1"]
    assert plan["wait"] == {"resolve": "tj-node-0-0.tj", "connect": "tj-node-0-0.tj:29500", "store": "tj-node-0-0.tj:29500"}
    assert plan["sources"]["node_rank"] == "PET_NODE_RANK"
    assert result.stderr == ""


def test_plan_and_the_cli_never_import_torch():
    probe = ("import sys, io, contextlib\nfrom launcher.cli import main\n"
             "with contextlib.redirect_stdout(io.StringIO()): main(['plan', '--', 'train.py'])\n"
             "print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", probe], env=clean_env(), cwd=REPO,
                            capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_version():
    result = subprocess.run(launcher("--version"), env=clean_env(), cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.startswith("trainer-launcher ")


def test_plan_keeps_the_kubeflow_sdks_static_rendezvous():
    """The SDK's container backend passes these flags and no PET_* at all."""
    flags = ["--nproc_per_node=1", "--nnodes=2", "--node-rank=1", "--rdzv-backend=static",
             "--rdzv-endpoint=10.89.0.5:29500"]
    result = subprocess.run(launcher("plan", "--", *flags, "/tmp/train.py"), env=clean_env(), cwd=REPO,
                            capture_output=True, text=True, check=True)
    plan = json.loads(result.stdout)
    assert plan["mode"] == "static"
    assert plan["argv"] == ["torchrun", "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", "1",
                            "--rdzv-backend", "static", "--rdzv-endpoint", "10.89.0.5:29500", "/tmp/train.py"]
    assert plan["wait"] == {"resolve": "10.89.0.5", "connect": "10.89.0.5:29500", "store": "10.89.0.5:29500"}


# This machine has no accelerator: the device probe alone is replaced, in the child, by one that
# reports two MIG devices; everything else is the real CLI.
_TWO_MIG_DEVICES = (
    "import sys\nfrom launcher.core import devices\n"
    "two = devices.Accelerators('NVIDIA MIG device', 2, 'NVIDIA_VISIBLE_DEVICES')\n"
    "devices.probe_host = lambda env: devices.HostFacts('tj-node-0-0', 2, 4.0, 8, False, two)\n"
    "from launcher.cli import main\nsys.exit(main(sys.argv[1:]))\n"
)


def plan_on_two_mig_devices(*options: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _TWO_MIG_DEVICES, "plan", *options, "--", "train.py"],
                          env=clean_env(PET_NPROC_PER_NODE="8", **env), cwd=REPO, capture_output=True, text=True,
                          check=True)


def test_plan_fits_the_controllers_cpu_count_to_the_visible_mig_devices_and_says_so_once():
    result = plan_on_two_mig_devices()
    plan = json.loads(result.stdout)

    assert plan["nprocPerNode"] == 2
    assert result.stderr.splitlines() == [f"trainer-launcher: warning: {plan['warnings'][0]}"]
    assert "PET_NPROC_PER_NODE=8 but only 2 NVIDIA MIG devices are visible" in plan["sources"]["nproc_per_node"]


@pytest.mark.parametrize("how", [("--keep-nproc", "1"), ()], ids=["flag", "variable"])
def test_keep_nproc_keeps_the_controllers_count(how):
    result = plan_on_two_mig_devices(*how, **({} if how else {"LAUNCHER_KEEP_NPROC": "true"}))
    assert json.loads(result.stdout)["nprocPerNode"] == 8


# Issue 36: 4 GPUs, PET_NPROC_PER_NODE=1. As above, only the device probe is replaced (no GPU here).
_FOUR_GPUS = (
    "import sys\nfrom launcher.core import devices\n"
    "devices.probe_host = lambda env: devices.HostFacts('tj-node-0-0', 4, 4.0, 8, False)\n"
    "from launcher.cli import main\nsys.exit(main(sys.argv[1:]))\n"
)
IDLE_GPUS = "PET_NPROC_PER_NODE=1 but 4 NVIDIA GPUs are visible (/dev/nvidiaN): 1 process leaves 3 idle"


def test_plan_warns_once_of_gpus_the_controllers_count_leaves_idle():
    result = subprocess.run([sys.executable, "-c", _FOUR_GPUS, "plan", "--", "train.py"],
                            env=clean_env(PET_NPROC_PER_NODE="1"), cwd=REPO, capture_output=True, text=True,
                            check=True)
    plan = json.loads(result.stdout)

    assert plan["nprocPerNode"] == 1
    assert plan["warnings"][0].startswith(IDLE_GPUS)
    assert result.stderr.splitlines() == [f"trainer-launcher: warning: {plan['warnings'][0]}"]


def test_a_run_logs_the_idle_gpus_before_its_plan_and_runs_the_count_it_was_given(tmp_path):
    program = tmp_path / "train.py"
    program.write_text("import os\nprint('world', os.environ['WORLD_SIZE'])\n")
    result = subprocess.run([sys.executable, "-c", _FOUR_GPUS, "torch", "--", str(program)],
                            env=clean_env(PET_NPROC_PER_NODE="1"), cwd=REPO, capture_output=True, text=True,
                            timeout=120)

    assert result.returncode == 0, result.stderr
    assert result.stdout == "world 1\n"
    assert result.stderr.splitlines()[0].startswith(f"trainer-launcher: warning: {IDLE_GPUS}"), result.stderr


SECRET = "hf_S3cretValueFromTheEnv42"


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_a_secret_on_the_command_line_is_redacted_in_the_start_line_and_in_plan(tmp_path, log_format):
    """Issue 22, row 8: `--hub_token hf_...` while HF_TOKEN holds it was printed in clear in the
    launcher's start line and in plan's JSON (the termination message was already redacted)."""
    env = clean_env(HF_TOKEN=SECRET, PET_NNODES="1", PET_NPROC_PER_NODE="1", LAUNCHER_LOG_FORMAT=log_format)
    plan = subprocess.run(launcher("plan", "--", "train.py", "--hub_token", SECRET), env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert plan.returncode == 0, plan.stderr
    assert SECRET not in plan.stdout + plan.stderr
    assert json.loads(plan.stdout)["argv"][-2:] == ["--hub_token", "***"]
    program = tmp_path / "train.py"
    program.write_text("import sys\nsys.exit(0)\n")
    run = subprocess.run(launcher("torch", "--", "--standalone", str(program), "--hub_token", SECRET), env=env,
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "--hub_token ***" in run.stderr or '"--hub_token", "***"' in run.stderr, run.stderr
    assert SECRET not in run.stdout + run.stderr
