"""Stacks from ranks the launcher cannot signal (MPI ranks on worker pods): real interpreters
with the hook connect to a real StackBoard over TCP and answer a dump request, one of them from
inside a real gloo all-reduce. The end-to-end MPI hang is in tests/test_status_e2e.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from launcher.status import stacks
from launcher.status.board import StackBoard
from test_stacks import GLOO_HANG, _free_port, processes, wait_for_line  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def board():
    found = StackBoard(socket.AF_INET, "127.0.0.1")
    yield found
    found.close()


def start_rank(tmp_path, program: str, board_env: dict[str, str], env: dict[str, str] | None = None,
               name: str = "prog.py", stdin: int | None = None) -> subprocess.Popen:
    """A rank as on a worker pod: the launcher's stacks directory does not exist on its machine."""
    script = tmp_path / name
    script.write_text(textwrap.dedent(program))
    child_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", stacks.STACKS_ENV)}
    child_env.update(stacks.rank_env(str(tmp_path / "on-the-launchers-pod"), None))
    child_env.update(board_env)
    child_env.update(env or {})
    return subprocess.Popen([sys.executable, str(script)], env=child_env, stdin=stdin, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def wait_connected(board: StackBoard, count: int) -> None:
    deadline = time.monotonic() + 60
    while board.connected < count:
        assert time.monotonic() < deadline, f"{board.connected} of {count} ranks connected"
        time.sleep(0.05)


def test_ranks_in_other_pods_answer_with_their_stacks_one_from_inside_a_gloo_all_reduce(tmp_path, board, processes):
    port = str(_free_port())
    ranks = []
    for rank in (0, 1):
        env = {"RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": port}
        ranks.append(start_rank(tmp_path, GLOO_HANG, board.env, env))
        processes.append(ranks[-1])
    wait_for_line(ranks[0], "entering all_reduce")
    wait_for_line(ranks[1], "not joining")
    wait_connected(board, 2)

    # Each prints its line just before the call it stays in: ask until both are inside (bounded).
    deadline = time.monotonic() + 30
    while True:
        by_rank = {s.rank: s for s in board.collect(wait=10)}
        inside = {0: "in all_reduce", 1: "prog.py:13 in <module>"}
        if all(r in by_rank and by_rank[r].top and by_rank[r].top[0].endswith(where) for r, where in inside.items()) \
                or time.monotonic() > deadline:
            break

    assert sorted(by_rank) == [0, 1]
    assert by_rank[0].top[0].endswith("in all_reduce"), by_rank[0].top  # answered with the GIL released
    assert any(frame.endswith("prog.py:10 in <module>") for frame in by_rank[0].top)
    assert by_rank[1].top[0].endswith("prog.py:13 in <module>")
    assert {s.node for s in by_rank.values()} == {socket.gethostname()}
    assert {s.pid for s in by_rank.values()} == {r.pid for r in ranks}
    assert all(r.poll() is None for r in ranks)  # asking stopped no one
    lines = []
    stacks.echo([by_rank[1]], lines.append)
    assert lines[0] == f"[stacks rank 1] pid {ranks[1].pid} on {socket.gethostname()}, local rank 0:"


def test_a_rank_that_is_gone_is_left_out_at_once_and_a_wrong_token_never_counts(tmp_path, board, processes):
    sleeper = "import time\nprint('ready', flush=True)\ntime.sleep(600)\n"
    alive = start_rank(tmp_path, sleeper, board.env, {"RANK": "0"}, name="alive.py")
    doomed = start_rank(tmp_path, sleeper, board.env, {"RANK": "1"}, name="doomed.py")
    processes.extend([alive, doomed])
    wait_connected(board, 2)
    address, port, _ = board.env[stacks.BOARD_ENV].rsplit("/", 2)
    with socket.create_connection((address, int(port))) as intruder:
        intruder.sendall(json.dumps({"token": "0" * 32, "pid": 1, "rank": 7}).encode() + b"\n")
        assert intruder.recv(16) == b""  # refused: closed without a word
    doomed.kill()
    doomed.wait()

    started = time.monotonic()
    found = board.collect(wait=20)
    assert [(s.rank, s.pid) for s in found] == [(0, alive.pid)]
    assert "alive.py" in found[0].top[0]
    assert time.monotonic() - started < 10, "waited on a rank whose connection had closed"


def test_a_board_out_of_reach_leaves_the_rank_silent_and_its_exit_alone(tmp_path, processes):
    unused = _free_port()
    rank = start_rank(tmp_path, "print('done')\n", {stacks.BOARD_ENV: f"127.0.0.1/{unused}/{'0' * 32}"})
    processes.append(rank)
    out, err = rank.communicate(timeout=60)
    assert (rank.returncode, out, err) == (0, "done\n", "")


def test_the_answering_thread_has_ended_before_the_interpreter_finalizes(tmp_path, board, processes):
    """A daemon thread that wakes during finalization can crash it: a one-line program under the
    hook exited by SIGSEGV or SIGABRT ("malloc_consolidate(): unaligned fastbin chunk detected")
    3 times in 300 on two loaded CPUs, a rank that had succeeded. The hook ends its thread at exit,
    before finalization; the program runs the exit handlers itself, then looks."""
    program = """\
        import atexit, threading
        print('connected', flush=True)
        import sys; sys.stdin.readline()
        atexit._run_exitfuncs()
        print([t.name for t in threading.enumerate() if t.name == 'trainer-launcher-stacks'], flush=True)
        """
    rank = start_rank(tmp_path, program, board.env, stdin=subprocess.PIPE)
    processes.append(rank)
    assert rank.stdout.readline() == "connected\n"
    wait_connected(board, 1)
    out, err = rank.communicate("\n", timeout=60)
    assert (rank.returncode, out, err) == (0, "[]\n", "")


def test_a_forked_child_exiting_normally_leaves_its_parents_connection_up(tmp_path, board, processes):
    """The child inherits the exit handler and the socket; shutting that socket down would cut the
    parent off the board, and the launcher would get no stack from a rank that is still there."""
    program = """\
        import os, sys, time
        sys.stdin.readline()  # once the hook's thread is connected
        child = os.fork()
        if child == 0:
            sys.exit(0)  # through the exit handlers, as a forked helper that returns does
        os.waitpid(child, 0)
        print('ready', flush=True)
        time.sleep(600)
        """
    rank = start_rank(tmp_path, program, board.env, {"RANK": "0"}, name="forks.py", stdin=subprocess.PIPE)
    processes.append(rank)
    wait_connected(board, 1)
    rank.stdin.write("fork\n")
    rank.stdin.flush()
    assert rank.stdout.readline() == "ready\n"
    found = board.collect(wait=20)
    assert [(s.rank, s.pid) for s in found] == [(0, rank.pid)]
    assert "forks.py" in found[0].top[0]
