"""`trainer-launcher exec`: any command, the same supervision and the same exit-code table."""

from __future__ import annotations

import signal
import sys

from conftest import Job, alive, clean_env, launcher, wait_for


def run(tmp_path, *command: str, options: tuple[str, ...] = (), **env: str) -> Job:
    job = Job(launcher("exec", *options, "--", *command), clean_env(**env), tmp_path)
    job.wait(60)
    return job


def test_the_command_exit_code_is_the_launcher_exit_code(tmp_path):
    job = run(tmp_path, "sh", "-c", "echo working; exit 7")
    assert job.process.returncode == 7
    assert job.stdout == "working\n"
    message = job.termination()
    assert (message["exitCode"], message["retryable"], message["reason"]) == (7, False, "Failed")
    assert message["lastLines"] == ["working"]


def test_success_is_zero_and_output_passes_through_byte_for_byte_its_last_line_ended(tmp_path):
    """Byte for byte, but a last line without its newline gets one: a pod's log would show it
    after the launcher's verdict (tests/test_output_order.py)."""
    job = run(tmp_path, "sh", "-c", "printf 'no \\r\\n\\tnewline'; printf 'err\\n' >&2")
    assert job.process.returncode == 0
    assert job.out.read_bytes() == b"no \r\n\tnewline\n"
    assert "err\n" in job.stderr


def test_a_crash_signal_is_permanent_128_plus_signal(tmp_path):
    job = run(tmp_path, "sh", "-c", "kill -SEGV $$")
    assert job.process.returncode == 139
    assert job.termination()["retryable"] is False
    assert job.termination()["rootCause"]["signal"] == "SIGSEGV"


def test_node_fault_text_in_the_output_makes_a_failure_retryable_138(tmp_path):
    job = run(tmp_path, "sh", "-c", "echo 'NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error' >&2; exit 1")
    assert job.process.returncode == 138
    assert job.termination()["reason"] == "NodeFault"


def test_a_user_pattern_makes_a_failure_retryable(tmp_path):
    job = run(tmp_path, "sh", "-c", "echo 'SpotReclaimed: node going away'; exit 1",
              options=("--retryable-pattern", "SpotReclaimed"))
    assert job.process.returncode == 138


def test_a_missing_command_is_127_in_one_line_and_not_retryable(tmp_path):
    job = run(tmp_path, "no-such-command-xyz")
    assert job.process.returncode == 127
    assert job.stderr.strip().count("\n") == 0
    assert "no-such-command-xyz: command not found" in job.stderr
    message = job.termination()
    assert (message["exitCode"], message["retryable"], message["reason"]) == (127, False, "CommandNotFound")


def test_a_custom_retryable_set_decides_the_message_too(tmp_path):
    job = run(tmp_path, "sh", "-c", "exit 7", LAUNCHER_RETRYABLE_EXIT_CODES="7")
    assert job.process.returncode == 7
    assert job.termination()["retryable"] is True
    assert "(retryable, RetryableExit)" in job.stderr


def test_sigterm_reaches_the_command_which_may_finish_cleanly(tmp_path):
    script = "import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\nprint('up', flush=True)\ntime.sleep(60)\n"
    job = Job(launcher("exec", "--", sys.executable, "-c", script), clean_env(), tmp_path)
    wait_for(lambda: "up" in job.stdout, what="the command to start")
    job.signal(signal.SIGTERM)
    assert job.wait(30) == 0  # the command chose to succeed, as under tini


def test_a_command_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path):
    script = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('up', flush=True)\ntime.sleep(60)\n"
    job = Job(launcher("exec", "--grace-period", "1", "--", sys.executable, "-c", script), clean_env(), tmp_path)
    wait_for(lambda: "up" in job.stdout, what="the command to start")
    job.signal(signal.SIGTERM)
    assert job.wait(30) == 143
    assert job.termination()["reason"] == "Terminated"


def test_background_processes_left_behind_are_stopped_before_the_launcher_exits(tmp_path):
    pid_file = tmp_path / "daemon.pid"
    job = run(tmp_path, "sh", "-c", f"sleep 300 & echo $! > {pid_file}; exit 0", options=("--grace-period", "2"))
    assert job.process.returncode == 0
    assert not alive(int(pid_file.read_text()))


def test_secrets_never_reach_the_termination_message_or_the_launchers_own_lines(tmp_path):
    token = "hf_SuperSecretToken123"
    job = run(tmp_path, "sh", "-c", 'echo "using $HF_TOKEN"; exit 4', HF_TOKEN=token)
    assert job.process.returncode == 4
    assert token not in job.termination_log.read_text()
    assert token not in "".join(line for line in job.stderr.splitlines() if line.startswith("trainer-launcher"))


def test_json_log_format_gives_one_json_object_per_launcher_line(tmp_path):
    import json

    job = run(tmp_path, "sh", "-c", "exit 9", options=("--log-format", "json"))
    assert job.process.returncode == 9
    records = [json.loads(line) for line in job.stderr.splitlines()]
    assert records[-1]["level"] == "error"
    assert records[-1]["exitCode"] == 9 and records[-1]["retryable"] is False


# A launcher nested in exec's command: the image's entrypoint runs the SDK's `bash -lc "...
# torchrun ..."` under `exec`, and the torchrun shim inside runs `trainer-launcher torch`.

def nested(*command: str) -> str:
    return " ".join([sys.executable, "-m", "launcher", "exec", "--", *command])


def launcher_lines(job: Job) -> list[str]:
    return [line for line in job.stderr.splitlines() if line.startswith("trainer-launcher:")]


def test_a_nested_launchers_outcome_is_the_outer_launchers_said_once(tmp_path):
    job = run(tmp_path, "bash", "-c", f"echo preparing; {nested('/nonexistent/train')}")
    assert job.process.returncode == 127
    message = job.termination()  # the outer's own termination log holds the inner's detail
    assert (message["reason"], message["retryable"]) == ("CommandNotFound", False)
    assert "/nonexistent/train" in message["message"]
    assert len(launcher_lines(job)) == 1, job.stderr  # not again as "bash exited with code 127"


def test_a_nested_launchers_success_is_said_once(tmp_path):
    job = run(tmp_path, "bash", "-c", nested("true"))
    assert job.process.returncode == 0
    assert launcher_lines(job) == ["trainer-launcher: the job succeeded"]


def test_a_nested_launcher_that_ran_earlier_does_not_speak_for_the_command(tmp_path):
    job = run(tmp_path, "bash", "-c", f"{nested('/nonexistent/prepare')}; exit 5")
    assert job.process.returncode == 5
    message = job.termination()
    assert (message["reason"], message["exitCode"]) == ("Failed", 5)
    assert message["message"].startswith("bash on ")
