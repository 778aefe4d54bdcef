"""A launcher process ends without the interpreter's teardown (launcher.core.process_exit), and
loses nothing by it: real processes, their exit code and what they printed."""

from __future__ import annotations

import os
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


def test_an_initializer_exits_with_its_code_and_its_output_whole(tmp_path):
    """``trainer-launcher init`` ends this way: its lines still reach a pipe whole, its files are there."""
    source = tmp_path / "pvc"
    source.mkdir()
    (source / "a.bin").write_bytes(os.urandom(70_000))
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "launcher", "init", "dataset", "--output", str(out)],
                          env=clean_env(STORAGE_URI=f"file://{source}"), cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    last = done.stderr.splitlines()[-1]
    assert "1 files, fetched 1 (" in last and " already complete, in " in last and last.endswith("s"), done.stderr
    assert (out / "a.bin").read_bytes() == (source / "a.bin").read_bytes()
    bad = subprocess.run([sys.executable, "-m", "launcher", "init", "dataset"], env=clean_env(), cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.rstrip("\n").endswith("(permanent, ConfigError)"), bad.stderr
