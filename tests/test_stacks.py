"""Every rank's Python stack without ptrace: the sitecustomize hook in real interpreters, and
launcher.status.stacks.collect signalling them (including a rank blocked inside a real gloo
all-reduce, where no Python code runs)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from launcher.status import stacks

pytestmark = pytest.mark.timeout(120)


def start(tmp_path, program: str, env: dict[str, str] | None = None, pythonpath: str | None = None,
          name: str = "prog.py") -> subprocess.Popen:
    script = tmp_path / name
    script.write_text(textwrap.dedent(program))
    stacks_dir = tmp_path / "stacks"
    stacks_dir.mkdir(exist_ok=True)
    child_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", stacks.STACKS_ENV)}
    child_env.update(stacks.rank_env(str(stacks_dir), pythonpath))
    child_env.update(env or {})
    return subprocess.Popen([sys.executable, str(script)], env=child_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def wait_for_line(process: subprocess.Popen, text: str) -> list[str]:
    seen = []
    for line in process.stdout:
        seen.append(line.rstrip("\n"))
        if text in line:
            return seen
    raise AssertionError(f"{text!r} never printed; saw {seen}; stderr: {process.stderr.read()}")


@pytest.fixture
def processes():
    started: list[subprocess.Popen] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait()
        for stream in (process.stdout, process.stderr):
            if stream:
                stream.close()


def test_a_rank_waiting_on_a_sleeping_thread_shows_both_threads(tmp_path, processes):
    rank = start(tmp_path, """
        import threading, time
        def load_batches():
            time.sleep(600)
        worker = threading.Thread(target=load_batches)
        worker.start()
        print("ready", flush=True)
        worker.join()
    """, env={"RANK": "3", "LOCAL_RANK": "1"})
    processes.append(rank)
    wait_for_line(rank, "ready")

    # "ready" is printed just before join(): dump until the main thread is inside it (bounded).
    deadline = time.monotonic() + 30
    while True:
        found = stacks.collect(str(tmp_path / "stacks"), wait=10)
        if any("in join" in frame for s in found for frame in s.top) or time.monotonic() > deadline:
            break

    assert [(s.pid, s.rank, s.local_rank) for s in found] == [(rank.pid, 3, 1)]
    top = found[0].top
    # The main thread's frames, innermost first: it waits in join, called from the program.
    assert "in join" in top[1] and top[-1].endswith("prog.py:8 in <module>")
    assert 'prog.py", line 4 in load_batches' in found[0].text  # the other thread is there too
    lines = []
    stacks.echo(found, lines.append)
    assert lines[0] == f"[stacks rank 3] pid {rank.pid}, local rank 1:"
    assert all(line.startswith("[stacks rank 3] ") for line in lines)
    assert rank.poll() is None  # dumping did not stop the rank


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


GLOO_HANG = """
    import datetime, os, time
    import torch, torch.distributed as dist
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    tensor = torch.ones(4)
    dist.all_reduce(tensor)
    if rank == 0:
        print("entering all_reduce", flush=True)
        dist.all_reduce(tensor)
    else:
        print("not joining", flush=True)
        time.sleep(600)
"""


def test_a_rank_blocked_in_a_real_gloo_all_reduce_still_dumps(tmp_path, processes):
    port = str(_free_port())
    ranks = []
    for rank in (0, 1):
        env = {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": port}
        ranks.append(start(tmp_path, GLOO_HANG, env=env))
        processes.append(ranks[-1])
    wait_for_line(ranks[0], "entering all_reduce")
    wait_for_line(ranks[1], "not joining")

    # Each prints its line just before the call it stays in: dump until both are inside (bounded).
    deadline = time.monotonic() + 30
    while True:
        found = stacks.collect(str(tmp_path / "stacks"), wait=10)
        by_rank = {s.rank: s for s in found}
        inside = {0: "in all_reduce", 1: "prog.py:13 in <module>"}
        if all(r in by_rank and by_rank[r].top and by_rank[r].top[0].endswith(where) for r, where in inside.items()) \
                or time.monotonic() > deadline:
            break

    assert sorted(by_rank) == [0, 1]
    assert by_rank[0].top[0].endswith("in all_reduce"), by_rank[0].top  # inside torch's C++ collective
    assert any(frame.endswith("prog.py:10 in <module>") for frame in by_rank[0].top)
    assert by_rank[1].top[0].endswith("prog.py:13 in <module>")  # the rank that never joined
    assert all(r.poll() is None for r in ranks)


def test_the_users_own_sitecustomize_still_runs_and_a_broken_one_breaks_nothing(tmp_path, processes):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['THEIRS_RAN'] = __file__\n")
    program = """
        import os, sys
        print("theirs:", os.environ.get("THEIRS_RAN"), flush=True)
        print("path:", sys.path[1:3], flush=True)
        print("ready", flush=True)
        import time
        time.sleep(600)
    """
    rank = start(tmp_path, program, env={"RANK": "0"}, pythonpath=str(theirs))
    processes.append(rank)
    lines = wait_for_line(rank, "ready")

    assert lines[0] == f"theirs: {theirs / 'sitecustomize.py'}"
    assert lines[1] == f"path: [{stacks.HOOK_DIR!r}, {str(theirs)!r}]"  # sys.path as PYTHONPATH said
    assert [s.pid for s in stacks.collect(str(tmp_path / "stacks"), wait=10)] == [rank.pid]

    (theirs / "sitecustomize.py").write_text("raise RuntimeError('their bug')\n")
    broken = start(tmp_path, 'print("ready", flush=True)\n__import__("time").sleep(600)\n',
                   pythonpath=str(theirs), name="broken.py")
    processes.append(broken)
    wait_for_line(broken, "ready")
    assert broken.pid in [s.pid for s in stacks.collect(str(tmp_path / "stacks"), wait=10)]
    broken.kill()
    assert "their bug" in broken.communicate()[1]  # said as Python itself would have said it


def test_the_hook_is_silent_and_python_children_of_a_rank_do_not_register(tmp_path, processes):
    rank = start(tmp_path, """
        import subprocess, sys
        child = subprocess.run([sys.executable, "-c", "print('child ran')"], capture_output=True, text=True)
        print(child.stdout.strip(), repr(child.stderr), flush=True)
        print("ready", flush=True)
        __import__("time").sleep(600)
    """, env={"RANK": "0"})
    processes.append(rank)
    lines = wait_for_line(rank, "ready")

    assert lines[0] == "child ran ''"
    assert os.listdir(tmp_path / "stacks") == [f"{rank.pid}.stacks"]
    rank.kill()
    assert rank.communicate()[1] == ""


def test_processes_that_did_not_register_are_never_signalled(tmp_path, processes):
    """A rank that is not Python never registers; a dump file whose pid now belongs to another
    process (the rank exited, the pid was reused) must not get the signal either: its default
    action would kill that process."""
    native = subprocess.Popen(["sleep", "600"], env={**os.environ, **stacks.rank_env(str(tmp_path / "stacks"), None)})
    processes.append(native)
    (tmp_path / "stacks").mkdir(exist_ok=True)
    (tmp_path / "stacks" / f"{native.pid}.stacks").write_text(
        f"# trainer-launcher stacks pid={native.pid} ppid=1 start=1 signal=39 main=0x1 rank=0 local_rank=0\n")

    assert stacks.collect(str(tmp_path / "stacks"), wait=1) == []
    assert native.poll() is None
    assert stacks.collect(str(tmp_path / "missing"), wait=1) == []
