"""A framework that is not the launcher's, plugged in as another package would plug it in: one
package (tests/plugin/tl_testfw) and one registry entry (an entry point of the group
``trainer_launcher.frameworks`` in its distribution's metadata), no line of ``launcher/`` touched.

Through the real CLI it gets what the launcher's own frameworks get: its subcommand and help, one
line and exit 2 for a bad variable, the wait for its peer, supervision, the exit-code table and the
termination message, the TrainJob's status (the HTTPS stand-in) and hang detection with the stack
of the process that stopped, inside the plug-in's own collective.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, Job, assert_one_line_naming, clean_env, free_port, launcher

PLUGIN = REPO / "tests" / "plugin"
ENTRY_POINTS = "[trainer_launcher.frameworks]\ntestfw = tl_testfw:FRAMEWORK\n"


def installed(tmp_path: Path, entry_points: str = ENTRY_POINTS) -> dict[str, str]:
    """The environment of a machine where the plug-in's distribution is installed: its metadata
    (with the entry point) and its package on the path, beside the launcher."""
    site = tmp_path / "site"
    info = site / "tl_testfw-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tl-testfw\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points)
    return {"PYTHONPATH": f"{site}:{PLUGIN}:{REPO}"}


def run_testfw(tmp_path: Path, *program: str, options: tuple[str, ...] = (), name: str = "job", **env: str) -> Job:
    site = tmp_path / name
    site.mkdir()
    return Job(launcher("testfw", *options, "--", *program), clean_env(**installed(site), **env), tmp_path, name)


def test_the_plugged_in_framework_is_a_subcommand_with_its_help(tmp_path):
    job = Job(launcher("--help"), clean_env(**installed(tmp_path)), tmp_path)
    assert job.wait(60) == 0, job.stderr
    assert "testfw" in job.stdout and "the test suite's framework" in job.stdout
    assert "left out" not in job.stderr


def test_it_runs_a_program_to_success(tmp_path):
    job = run_testfw(tmp_path, sys.executable, "-c", "import os; print('world', os.environ['TESTFW_WORLD_SIZE'])",
                 TESTFW_WORLD="3")
    assert job.wait(60) == 0, job.stderr
    assert "world 3" in job.stdout
    assert job.stderr.rstrip().endswith("trainer-launcher: the job succeeded"), job.stderr
    assert job.termination()["exitCode"] == 0


def test_a_bad_variable_of_its_own_is_one_line_and_exit_2_before_anything_runs(tmp_path):
    marker = tmp_path / "ran"
    job = run_testfw(tmp_path, sys.executable, "-c", f"open({str(marker)!r}, 'w').close()", TESTFW_WORLD="many")
    job.wait(60)
    assert_one_line_naming(subprocess.CompletedProcess(job.process.args, job.process.returncode, job.stdout, job.stderr),
                           "TESTFW_WORLD", "many")
    assert not marker.exists()
    assert job.termination()["reason"] == "ConfigError"


def test_it_waits_for_its_peer_and_a_peer_that_never_comes_is_a_retryable_rendezvous_timeout(tmp_path):
    with socket.socket() as peer:
        peer.bind(("127.0.0.1", 0))
        peer.listen()
        job = run_testfw(tmp_path, sys.executable, "-c", "print('after the wait')",
                     TESTFW_PEER=f"127.0.0.1:{peer.getsockname()[1]}")
        assert job.wait(60) == 0, job.stderr
    assert "after the wait" in job.stdout

    nobody = run_testfw(tmp_path, sys.executable, "-c", "print('never')", name="nobody",
                    TESTFW_PEER=f"127.0.0.1:{free_port()}", LAUNCHER_RENDEZVOUS_TIMEOUT="2")
    assert nobody.wait(60) == 138, nobody.stderr
    assert "never" not in nobody.stdout
    message = nobody.termination()
    assert (message["reason"], message["retryable"]) == ("RendezvousTimeout", True)


@pytest.mark.parametrize("retryable_codes, reason, retryable", [
    (None, "Failed", False),
    ("3,138", "RetryableExit", True),
])
def test_a_failing_program_ends_by_the_exit_table(tmp_path, retryable_codes, reason, retryable):
    env = {"LAUNCHER_RETRYABLE_EXIT_CODES": retryable_codes} if retryable_codes else {}
    job = run_testfw(tmp_path, sys.executable, "-c", "print('loss is nan'); raise SystemExit(3)", **env)
    assert job.wait(60) == 3, job.stderr
    message = job.termination()
    assert (message["exitCode"], message["reason"], message["retryable"]) == (3, reason, retryable)
    assert message["lastLines"] == ["loss is nan"]


def test_its_outcome_reaches_the_trainjob_status(tmp_path, status_server):
    job = run_testfw(tmp_path, sys.executable, "-c", "print('step=5/10 loss=0.5', flush=True); raise SystemExit(3)",
                 **status_server.env())
    assert job.wait(60) == 3, job.stderr
    records = status_server.wait_for(
        lambda rs: [r for r in rs if r["code"] == 200 and "exit_code" in _metrics(r)], what="the final status")
    final = _metrics([r for r in records if r["code"] == 200 and "exit_code" in _metrics(r)][-1])
    assert (final["exit_code"], final["reason"], final["retryable"]) == ("3", "Failed", "false")


# Both ranks write to one pipe (the plug-in's pod runs one command); the line goes in one write, as
# print() under PYTHONUNBUFFERED=1 (set in many images) would not: it writes the text and the newline
# apart, and two ranks' halves interleave into a line that is no progress report.
HANGS = """\
import os, sys, time

def tl_testfw_collective():  # the plug-in's collective, as its registry entry names it
    time.sleep(3600)

def compute():
    time.sleep(3600)

os.write(1, b"step=1/10\\n")
(tl_testfw_collective if sys.argv[1] == "0" else compute)()
"""


def test_a_hang_ends_the_job_naming_the_rank_outside_the_plug_ins_collective(tmp_path):
    """Both ranks report the same last step; rank 0's stack is in the plug-in's collective (its
    registry entry says how to know one), rank 1's is not: rank 1 is the one that stopped."""
    program = tmp_path / "hangs.py"
    program.write_text(HANGS)
    ranks = f"RANK=0 {sys.executable} {program} 0 & RANK=1 {sys.executable} {program} 1 & wait"
    job = run_testfw(tmp_path, "sh", "-c", ranks, options=("--hang-timeout", "3", "--grace-period", "2"))
    assert job.wait(120) == 138, job.stderr
    message = job.termination()
    assert (message["reason"], message["retryable"]) == ("Hang", True), message
    assert message["hang"]["stoppedRanks"] == [1], message
    assert "compute" in json.dumps(message["hang"]), message


def test_a_broken_plug_in_is_left_out_with_one_line_and_the_launcher_runs_on(tmp_path):
    env = installed(tmp_path, ENTRY_POINTS + "broken = tl_testfw_missing:FRAMEWORK\ntorch = tl_testfw:FRAMEWORK\n")
    job = Job(launcher("testfw", "--", sys.executable, "-c", "print('still here')"), clean_env(**env), tmp_path)
    assert job.wait(60) == 0, job.stderr
    assert "still here" in job.stdout
    left_out = [line for line in job.stderr.splitlines() if "left out" in line]
    assert len(left_out) == 2 and any("tl_testfw_missing" in line for line in left_out), job.stderr


def _metrics(record: dict) -> dict[str, str]:
    status = (record.get("body") or {}).get("trainerStatus") or {}
    return {m["name"]: m["value"] for m in status.get("metrics", [])}
