"""torchrun's own shutdown wait follows the launcher's grace period, on every path: here a rank
fails and torchrun stops the other, which ignores SIGTERM. Unpatched, torch 2.13 waits a
hardcoded 30 s before its SIGKILL there, whatever TORCH_ELASTIC_SHUTDOWN_TIMEOUT says."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import Job, clean_env, launcher

pytestmark = pytest.mark.timeout(120)

# Rank 0 keeps its own record in READY_DIR, each file written whole (tmp, then os.replace):
# "rank0" (it ignores SIGTERM now; its pid), "sigterm_at" (when the first SIGTERM reached it) and
# "alive_at" (a heartbeat every 0.1 s). It never ends by itself: only a SIGKILL stops the heartbeat.
# Both times are its own clock's, so how long it lived after SIGTERM does not depend on how long
# the job took to start on a loaded machine.
PROGRAM = """
import os, signal, sys, time
here = os.environ["READY_DIR"]
ready = os.path.join(here, "rank0")

def record(name, value):
    path = os.path.join(here, name)
    with open(path + ".tmp", "w") as f:
        f.write(repr(value))
    os.replace(path + ".tmp", path)

def ignore(*_):
    print("rank 0 ignores SIGTERM", flush=True)
    if not os.path.exists(os.path.join(here, "sigterm_at")):  # the grace runs from the first
        record("sigterm_at", time.monotonic())

if os.environ["RANK"] == "0":
    signal.signal(signal.SIGTERM, ignore)
    record("rank0", os.getpid())
    while True:
        record("alive_at", time.monotonic())
        time.sleep(0.1)
while not os.path.exists(ready):  # fail only once rank 0 ignores SIGTERM
    time.sleep(0.05)
sys.exit(3)
"""


def test_a_rank_that_ignores_sigterm_is_killed_after_the_grace_period_not_30s(tmp_path: Path):
    program = tmp_path / "prog.py"
    program.write_text(PROGRAM)
    job = Job(launcher("torch", "--grace-period", "3", "--", "--standalone", "--nproc-per-node", "2", str(program)),
              clean_env(READY_DIR=str(tmp_path)), tmp_path)
    code = job.wait(timeout=90)

    assert code == 3, job.stderr
    assert "rank 0 ignores SIGTERM" in job.stdout + job.stderr  # it was asked first, then killed
    pid = int((tmp_path / "rank0").read_text())
    killed = rf"Unable to shutdown process {pid} via \S+, forcefully exiting via (9|\S*SIGKILL)\b"
    assert re.search(killed, job.stderr), f"torchrun did not SIGKILL rank 0 (pid {pid}):\n{job.stderr}"
    assert (tmp_path / "sigterm_at").exists(), f"rank 0 never got SIGTERM:\n{job.stdout}{job.stderr}"
    lived = float((tmp_path / "alive_at").read_text()) - float((tmp_path / "sigterm_at").read_text())
    # Its last heartbeat comes at most one beat (0.1 s) and a wake-up before the SIGKILL.
    assert lived >= 2.5, f"rank 0 lived {lived:.2f}s after SIGTERM: it was killed before the 3 s grace"
    assert lived < 15, f"rank 0 lived {lived:.2f}s after SIGTERM: torchrun waited its own 30 s, not the 3 s grace"
    termination = json.loads(job.termination_log.read_text())
    assert termination["rootCause"]["rank"] == 1
