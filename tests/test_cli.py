"""The command line as a user meets it: plan output, version, and a start that stays light."""

from __future__ import annotations

import json
import subprocess
import sys

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
    assert plan["wait"] == {"resolve": "tj-node-0-0.tj", "connect": "tj-node-0-0.tj:29500"}
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
