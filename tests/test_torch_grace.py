"""torchrun's own shutdown wait follows the launcher's grace period, on every path: here a rank
fails and torchrun stops the other, which ignores SIGTERM. Unpatched, torch 2.13 waits a
hardcoded 30 s before its SIGKILL there, whatever TORCH_ELASTIC_SHUTDOWN_TIMEOUT says."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from conftest import Job, clean_env, launcher

pytestmark = pytest.mark.timeout(120)

PROGRAM = """
import os, signal, sys, time
ready = os.path.join(os.environ["READY_DIR"], "rank0")
if os.environ["RANK"] == "0":
    signal.signal(signal.SIGTERM, lambda *_: print("rank 0 ignores SIGTERM", flush=True))
    with open(ready + ".tmp", "w"):
        pass
    os.replace(ready + ".tmp", ready)
    while True:
        time.sleep(0.2)
while not os.path.exists(ready):  # fail only once rank 0 ignores SIGTERM
    time.sleep(0.05)
sys.exit(3)
"""


def test_a_rank_that_ignores_sigterm_is_killed_after_the_grace_period_not_30s(tmp_path: Path):
    program = tmp_path / "prog.py"
    program.write_text(PROGRAM)
    started = time.monotonic()
    job = Job(launcher("torch", "--grace-period", "3", "--", "--standalone", "--nproc-per-node", "2", str(program)),
              clean_env(READY_DIR=str(tmp_path)), tmp_path)
    code = job.wait(timeout=90)
    took = time.monotonic() - started

    assert code == 3, job.stderr
    assert "rank 0 ignores SIGTERM" in job.stdout + job.stderr  # it was asked first, then killed
    assert took < 20, f"the job took {took:.1f}s: torchrun waited its own 30 s instead of the 3 s grace"
    termination = json.loads(job.termination_log.read_text())
    assert termination["rootCause"]["rank"] == 1
