"""A launcher process ends without the interpreter's teardown (launcher.core.process_exit), and
loses nothing by it: real processes, their exit code and what they printed."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO, clean_env


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=clean_env(), cwd=REPO, capture_output=True, text=True,
                          timeout=60)


def test_the_exit_code_the_buffered_output_and_the_exit_handlers_all_survive():
    done = _run("import atexit, sys\n"
                "from launcher.core.process_exit import exit_now\n"
                "atexit.register(lambda: print('the handler ran'))\n"
                "sys.stdout.write('buffered, no newline; ')\n"
                "sys.stderr.write('and on stderr')\n"
                "exit_now(3)\n")
    assert done.returncode == 3
    assert done.stdout == "buffered, no newline; the handler ran\n"
    assert done.stderr == "and on stderr"


def test_a_thread_still_working_is_waited_for():
    """A non-daemon thread (say, one still sending the final status) finishes before the process ends."""
    done = _run("import threading, time\n"
                "from launcher.core.process_exit import exit_now\n"
                "def late():\n"
                "    time.sleep(0.5)\n"
                "    print('the thread finished', flush=True)\n"
                "threading.Thread(target=late).start()\n"
                "exit_now(4)\n")
    assert (done.returncode, done.stdout) == (4, "the thread finished\n")


def test_the_command_exits_with_its_code_and_its_output_whole():
    """``trainer-launcher`` and ``python -m launcher`` end this way: the plan still reaches a pipe whole."""
    done = subprocess.run([sys.executable, "-m", "launcher", "plan", "--", "python3", "/job/train.py"],
                          env=clean_env(PET_NNODES="2", PET_NODE_RANK="1", PET_MASTER_ADDR="tj-node-0-0.tj"),
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip().endswith("}") and '"nodeRank": 1' in done.stdout
