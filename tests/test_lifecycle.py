"""The pod's life, written once (launcher/core/lifecycle.py): the steps in their order, and what
each way out of them does to the processes started early and to the outcome. A stand-in pod that
records its hooks runs in a process of its own (the supervisor tears down every process below the
one it runs in: in pytest's own, the session's servers)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from conftest import clean_env

POD = r"""
import json, os, sys, time
from launcher.core import lifecycle
from launcher.core.outcome import ConfigError, WaitTimeout, classify, success

how, record = sys.argv[1], sys.argv[2]
# Started early, it waits for its go word and says what it got: the word, or end of file.
EARLY = "import os, sys; data = os.read(int(sys.argv[1]), 100); print('early got ' + (data.decode().strip() or 'EOF'))"


class Stand(lifecycle.Pod):
    name = "stand"

    def __init__(self):
        self.steps = []

    def step(self, name):
        self.steps.append(name)
        with open(record + ".tmp", "w") as handle:
            json.dump(self.steps, handle)
        os.replace(record + ".tmp", record)

    def start_early(self, life):
        self.step("start_early")
        self.go_word = life.go_pipe()
        self.early = life.spawn("early", [sys.executable, "-c", EARLY, str(self.go_word.child_fd), record],
                                pipes=(self.go_word,))

    def plan(self, life):
        self.step("plan")
        if how == "bad-plan":
            raise ConfigError("STAND_VALUE", "x", "a value the stand-in takes")
        return lifecycle.Planned(None, "pod-a", "stand: planned")

    def start(self, life):
        self.step("start")

    def wait(self, life):
        self.step("wait")
        if how == "wait-times-out":
            raise WaitTimeout("the stand-in's peer never came")
        if how == "signal-in-wait":
            while True:
                life.supervisor.sleep(0.2)

    def go(self, life):
        self.step("go")
        self.go_word.send(b"go\n")
        self.go_word.close()

    def judge(self, life):
        self.step("judge")
        if life.supervisor.received_signal is not None:
            return classify(128 + life.supervisor.received_signal, what="the stand-in")
        return success()

    def conclude(self, life, own):
        self.step("conclude")
        return classify(7, what="the stand-in's conclusion") if how == "concluded" else own


sys.exit(lifecycle.live(Stand(), {}))
"""


def live(tmp_path, how: str, signal_at: str | None = None) -> tuple[int, list[str], str]:
    record = tmp_path / "steps.json"
    process = subprocess.Popen([sys.executable, "-c", POD, how, str(record)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=clean_env())
    if signal_at is not None:
        deadline = time.monotonic() + 60
        while not (record.exists() and signal_at in json.loads(record.read_text())):
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=120)
    return process.returncode, json.loads(record.read_text()), out + err


def test_a_pod_walks_every_step_in_order_and_its_early_process_gets_the_go_word(tmp_path):
    code, steps, said = live(tmp_path, "runs")
    assert code == 0, said
    assert steps == ["start_early", "plan", "start", "wait", "go", "judge", "conclude"]
    assert "early got go" in said and "stand: planned" in said


def test_what_the_pod_settles_with_its_peers_is_the_outcome(tmp_path):
    code, steps, said = live(tmp_path, "concluded")
    assert code == 7 and "the stand-in's conclusion" in said


def test_bad_input_ends_after_the_plan_in_one_line_naming_the_pod_and_the_early_process_leaves_unsaid(tmp_path):
    code, steps, said = live(tmp_path, "bad-plan")
    assert code == 2 and steps == ["start_early", "plan"]
    assert "STAND_VALUE" in said and "Traceback" not in said
    assert "early got go" not in said


def test_a_wait_that_times_out_tears_down_what_started_and_is_retryable_138(tmp_path):
    code, steps, said = live(tmp_path, "wait-times-out")
    assert code == 138, said
    assert steps == ["start_early", "plan", "start", "wait"]
    assert "the stand-in's peer never came" in said and "early got go" not in said


def test_a_signal_during_the_wait_skips_the_go_word_and_is_judged(tmp_path):
    code, steps, said = live(tmp_path, "signal-in-wait", signal_at="wait")
    assert code == 128 + signal.SIGTERM, said
    assert steps == ["start_early", "plan", "start", "wait", "judge", "conclude"]
    assert "early got go" not in said


def test_no_child_outlives_the_pod(tmp_path):
    code, _, said = live(tmp_path, "wait-times-out")
    early = [line for line in said.splitlines() if "early got" in line]
    assert code == 138 and early in ([], ["early got EOF"]), said
    # The early process carries this test's record path: other tests' stand-ins may run beside it.
    mine = str(tmp_path / "steps.json").encode()
    assert not [pid for pid in os.listdir("/proc") if pid.isdigit() and _is_this_stand_in(pid, mine)]


def _is_this_stand_in(pid: str, mine: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            argv = handle.read().split(b"\0")
    except OSError:
        return False
    return mine in argv and any(b"early got" in part for part in argv)


BESIDE = r"""
import os, signal, sys, threading
from launcher.core.supervisor import Supervisor

how = sys.argv[1]
release = threading.Event()


def work():
    if how == "raises":
        raise ValueError("the work's own error")
    if how == "blocks":
        print("working", flush=True)
        release.wait()
    return 42


with Supervisor() as supervisor:
    try:
        result = supervisor.serve_during(work, lambda: None, every=3600)  # an hour: only a wake ends it
    except ValueError as error:
        result = str(error)
    print(f"result {result!r} signal {supervisor.received_signal}", flush=True)
"""


def beside(how: str, signal_it: bool = False) -> str:
    """The supervisor's loop served while work runs on a thread beside it; what it came back with."""
    process = subprocess.Popen([sys.executable, "-c", BESIDE, how], env=clean_env(), stdout=subprocess.PIPE, text=True)
    if signal_it:
        assert process.stdout.readline() == "working\n"
        process.send_signal(signal.SIGTERM)
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 0, out
    return out.strip()


def test_work_beside_the_loop_comes_back_the_moment_it_ends_not_at_the_next_tick():
    # The export runs this way after the job: the pod exits when the upload ends, not up to a tick later.
    assert beside("returns") == "result [42] signal None"


def test_work_beside_the_loop_raises_its_error_in_the_serving_thread():
    assert beside("raises") == "result \"the work's own error\" signal None"


def test_a_signal_ends_the_serving_at_once_and_leaves_the_work_behind():
    assert beside("blocks", signal_it=True) == f"result [] signal {int(signal.SIGTERM)}"


# --- restarts in place ------------------------------------------------------------------------------

GENERATIONS = r"""
import os, sys
from launcher.core import lifecycle
from launcher.core.outcome import classify, success

how, record = sys.argv[1], sys.argv[2]
CODES = {"retryable-once": [137, 0], "permanent": [3, 0], "retryable-always": [143, 143, 143]}[how]
# The next generation's process, started ahead: it waits for its exit code on a pipe.
AHEAD = "import os, sys; sys.exit(int(os.read(int(sys.argv[1]), 10) or b'0'))"


class Generations(lifecycle.Pod):
    name = "stand"
    restarts_in_place = True

    def __init__(self):
        self.steps, self.ahead, self.job = [], None, None

    def step(self, name):
        self.steps.append(name)
        with open(record + ".tmp", "w") as handle:
            json.dump(self.steps, handle)
        os.replace(record + ".tmp", record)

    def plan(self, life):
        return lifecycle.Planned(None, "pod-a", "", max_restarts=2)

    def go(self, life):
        code, generation = CODES[life.generation], life.generation
        self.step(f"go {generation} count={life.runner_env()['LAUNCHER_RESTART_COUNT']}")
        if self.ahead is None:
            self.job = life.spawn("job", [sys.executable, "-c", f"import sys; sys.exit({code})"])
        else:
            self.job, pipe = self.ahead
            pipe.send(str(code).encode())
            pipe.close()
        if generation < life.max_restarts:
            pipe = life.go_pipe()
            ahead = life.spawn("ahead", [sys.executable, "-c", AHEAD, str(pipe.child_fd), record], pipes=(pipe,),
                               standby=True)
            self.ahead = (ahead, pipe)

    def restart(self, life):
        ahead = self.ahead[0]
        self.step(f"restart {life.generation} ahead alive={ahead.returncode is None} adopted={not ahead.standby}")

    def judge(self, life):
        code = self.job.exit_status
        return success() if code == 0 else classify(code, what=f"the job of generation {life.generation}")


import json
sys.exit(lifecycle.live(Generations(), {}))
"""


def generations(tmp_path, how: str) -> tuple[int, list[str], str]:
    record = tmp_path / "steps.json"
    process = subprocess.run([sys.executable, "-c", GENERATIONS, how, str(record)], capture_output=True, text=True,
                             env=clean_env(LAUNCHER_TERMINATION_LOG=str(tmp_path / "termination.json")),
                             timeout=120)
    assert not [pid for pid in os.listdir("/proc") if pid.isdigit() and _runs_with(pid, str(record).encode())]
    return process.returncode, json.loads(record.read_text()), process.stdout + process.stderr


def _runs_with(pid: str, mine: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return mine in handle.read().split(b"\0")
    except OSError:
        return False


def test_a_retryable_end_starts_the_next_generation_with_the_process_that_stood_by(tmp_path):
    """The process started ahead is neither waited for nor torn down with its generation (the
    generation ends while it lives), is adopted by the next, and none outlives the pod."""
    code, steps, said = generations(tmp_path, "retryable-once")
    assert code == 0, said
    assert steps == ["go 0 count=0", "restart 1 ahead alive=True adopted=True", "go 1 count=1"]
    assert "restart 1 of 2: the job failed retryably (RetryableExit, exit 137, pod-a)" in said
    history = json.loads((tmp_path / "termination.json").read_text())["restarts"]
    assert [(h["generation"], h["reason"], h["exitCode"]) for h in history] == [(0, "RetryableExit", 137)]


def test_a_permanent_end_is_never_restarted(tmp_path):
    code, steps, said = generations(tmp_path, "permanent")
    assert code == 3 and steps == ["go 0 count=0"] and "restart" not in said


def test_when_the_restarts_run_out_the_last_end_stands(tmp_path):
    code, steps, said = generations(tmp_path, "retryable-always")
    assert code == 143, said
    assert [s for s in steps if s.startswith("go")] == ["go 0 count=0", "go 1 count=1", "go 2 count=2"]
    assert said.count("restart ") == 2 and "restart 2 of 2" in said
