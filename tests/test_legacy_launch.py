"""``python -m torch.distributed.launch`` and ``python -m torch.distributed.run`` as a TrainJob's
command: through the images' ``python`` shim to ``trainer-launcher torch`` (``--distributed-launch``
for the deprecated module, whose scripts get ``--local-rank`` unless ``--use-env``), real torch on CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, Job, clean_env, rank_reports

PROGRAM = str(REPO / "tests" / "programs" / "legacy_launch.py")
SHIMS = REPO / "images" / "shims"


def shim_env(**extra: str) -> dict[str, str]:
    """The images' PATH: the shims first, then the launcher's environment."""
    return clean_env(PATH=f"{SHIMS}:{Path(sys.executable).parent}:{os.environ['PATH']}", **extra)


@pytest.mark.parametrize("module, use_env, by_argument", [
    ("torch.distributed.launch", False, True),  # the deprecated module's default: --local-rank=N
    ("torch.distributed.launch", True, False),
    ("torch.distributed.run", False, False),  # torchrun: LOCAL_RANK only
])
def test_the_module_as_the_command_runs_through_the_launcher(tmp_path, report_dir, module, use_env, by_argument):
    argv = ["python", "-m", module, "--standalone", "--nproc-per-node", "2", *(["--use-env"] if use_env else []),
            PROGRAM, "--tag", "kept"]
    job = Job(argv, shim_env(REPORT_DIR=str(report_dir)), tmp_path)
    assert job.wait(180) == 0, job.stderr
    assert "trainer-launcher: torch: standalone" in job.stderr and "trainer-launcher: the job succeeded" in job.stderr
    reports = rank_reports(report_dir)
    assert sorted(reports) == [0, 1] and {r["allreduce"] for r in reports.values()} == {3.0}
    assert {r["tag"] for r in reports.values()} == {"kept"}
    assert [reports[rank]["envLocalRank"] for rank in (0, 1)] == ["0", "1"]
    assert [reports[rank]["argLocalRank"] for rank in (0, 1)] == ([0, 1] if by_argument else [None, None])


def test_a_failing_rank_keeps_its_code_under_the_deprecated_module(tmp_path):
    job = Job(["python", "-m", "torch.distributed.launch", "--standalone", "--nproc-per-node", "2",
               str(REPO / "tests" / "programs" / "ranks.py")],
              shim_env(BEHAVIOUR="exit:3", FAIL_RANK="1"), tmp_path)
    assert job.wait(180) == 3, job.stderr  # torch.distributed.launch alone exits 1
    assert job.termination()["rootCause"]["rank"] == 1


def test_any_other_python_is_the_next_one_on_path_unchanged():
    env = shim_env()
    result = subprocess.run(["python3", "-c", "import sys; print(sys.executable, sys.argv[1:])", "a", "b"],
                            env=env, capture_output=True, text=True, timeout=60, check=False)
    # python3 from the launcher's environment, with its arguments, as without the shim
    assert result.returncode == 0 and result.stdout.split() == [str(Path(sys.executable).parent / "python3"),
                                                               "['a',", "'b']"], result
    result = subprocess.run(["python", "-m", "torch.distributed.launch", "--help"], env=env, capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0 and "--use-env" in result.stdout, result.stderr  # the module's own help
    result = subprocess.run(["python", "-m", "torch.distributed.run", "--standalone", "x.py"],
                            env={**env, "TRAINER_LAUNCHER_SHIM": "off"}, capture_output=True, text=True, timeout=120,
                            check=False)
    assert "trainer-launcher" not in result.stderr  # off: torch's own torchrun


def test_plan_shows_the_modules_line(tmp_path):
    result = subprocess.run([sys.executable, "-m", "launcher", "plan", "--distributed-launch", "--", "--standalone",
                             "--nproc-per-node", "2", "--use_env", "train.py", "--lr", "1"],
                            env=clean_env(), capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["argv"][:3] == ["python", "-m", "torch.distributed.launch"]
    assert document["argv"][-4:] == ["--use-env", "train.py", "--lr", "1"] and document["useEnv"] is True
