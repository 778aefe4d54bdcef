"""Rank reports: ``python -m launcher.mpi.rank`` as a real process, telling a real listener
(``launcher.mpi.reports``) which rank failed and why, in the launcher's one report
(launcher/runner/report.py). The multi-host runs, with every MPI, are in tests/test_mpi.py; these
pin down what is and is not reported, and what the listener refuses."""

from __future__ import annotations

import ipaddress
import json
import signal
import socket
import subprocess
import sys
import threading

import pytest

from conftest import REPO, alive, clean_env, wait_for
from launcher.mpi import rank
from launcher.mpi.reports import RankReports, facing_address
from launcher.runner.report import Report

pytest.importorskip("mpi4py")


@pytest.fixture
def reports():
    with RankReports(socket.AF_INET, "127.0.0.1") as listener:
        yield listener


def run_rank(tmp_path, reports: RankReports, body: str, **env) -> subprocess.CompletedProcess:
    """``python -m launcher.mpi.rank train.py --lr 0.1``, reporting to ``reports``."""
    program = tmp_path / "train.py"
    program.write_text(body)
    return subprocess.run([sys.executable, "-m", "launcher.mpi.rank", str(program), "--lr", "0.1"],
                          env=clean_env(**reports.env, **env), cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)


def test_an_exception_is_reported_with_rank_node_and_message_before_the_rank_exits(tmp_path, reports):
    result = run_rank(tmp_path, reports, "import sys\nassert sys.argv[1:] == ['--lr', '0.1']\n"
                                         "raise ValueError('loss is nan')\n",
                      OMPI_COMM_WORLD_RANK="5", OMPI_COMM_WORLD_LOCAL_RANK="1")
    assert result.returncode == 1
    assert "ValueError: loss is nan" in result.stderr  # the traceback still reaches the log
    assert reports.received == [Report(ending="failed", exit_code=1, rank=5, local_rank=1, node=socket.gethostname(),
                                       error="ValueError: loss is nan")]


@pytest.mark.parametrize("body, code, error", [
    ("import sys\nsys.exit(3)\n", 3, None),
    ("import sys\nsys.exit('out of disk')\n", 1, "out of disk"),
], ids=["exit-code", "exit-message"])
def test_a_failing_sys_exit_is_reported(tmp_path, reports, body, code, error):
    result = run_rank(tmp_path, reports, body, PMI_RANK="2", MPI_LOCALRANKID="0")
    assert result.returncode == code
    assert reports.received == [Report(ending="failed", exit_code=code, rank=2, local_rank=0, node=socket.gethostname(),
                                       error=error)]


def test_an_mpi4py_out_of_range_is_reported_as_refused_before_the_program_runs(tmp_path, reports):
    """Stand-in: an mpi4py 3.0.0 (below the range) cannot be installed beside the real one, so only
    its metadata is put first on the path; the rank refuses before anything imports mpi4py."""
    site = tmp_path / "site"
    (site / "mpi4py-3.0.0.dist-info").mkdir(parents=True)
    (site / "mpi4py-3.0.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: mpi4py\nVersion: 3.0.0\n")
    result = run_rank(tmp_path, reports, "print('ran')\n", PMI_RANK="3", PYTHONPATH=f"{REPO}:{site}")
    assert (result.returncode, result.stdout) == (2, "")
    [refused] = reports.received
    assert (refused.ending, refused.reason, refused.exit_code, refused.rank) == ("refused", "UnsupportedVersion", 2, 3)
    assert refused.node == socket.gethostname() and "mpi4py='3.0.0'" in (refused.error or "")
    assert refused.error in result.stderr  # the same one line in the rank's log


@pytest.mark.parametrize("body", [
    "print('done')\n",
    "import sys\nsys.exit(0)\n",
    "import sys\nsys.exit()\n",
    "raise KeyboardInterrupt\n",  # mpirun tearing the job down for another rank's failure
], ids=["success", "exit-0", "exit-none", "interrupted"])
def test_nothing_is_reported_for_success_or_an_interrupt(tmp_path, reports, body):
    run_rank(tmp_path, reports, body, PMI_RANK="0")
    assert reports.received == []


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGSEGV], ids=["SIGKILL", "SIGSEGV"])
def test_a_signal_that_ends_the_program_is_reported_by_its_watcher_which_ends_the_same_way(tmp_path, reports, signum):
    """The OOM killer's SIGKILL, a segfault: the program cannot say so itself; the process mpirun
    started (the watcher) reports the signal, then ends by it, as mpirun saw before."""
    body = f"import os\nos.kill(os.getpid(), {int(signum)})\n"
    result = run_rank(tmp_path, reports, body, PMI_RANK="1", MPI_LOCALRANKID="1")
    assert result.returncode == -signum, result.stderr
    assert reports.received == [Report(ending="failed", rank=1, local_rank=1, node=socket.gethostname(),
                                       signal=signum.name)]


def test_a_sigterm_from_outside_is_passed_on_to_the_program_and_not_reported(tmp_path, reports):
    """mpirun stopping its ranks (another rank's failure, the pod's SIGTERM) signals the process it
    started: the program gets it, and ends by it; a teardown, not the rank's own failure."""
    ready = tmp_path / "ready"
    body = ("import os, signal, time\n"
            "signal.signal(signal.SIGTERM, lambda *_: (print('got SIGTERM', flush=True), os._exit(7)))\n"
            f"open({str(ready)!r} + '.tmp', 'w').write(str(os.getpid()))\n"
            f"os.replace({str(ready)!r} + '.tmp', {str(ready)!r})\n"
            "time.sleep(120)\n")
    program = tmp_path / "train.py"
    program.write_text(body)
    watcher = subprocess.Popen([sys.executable, "-m", "launcher.mpi.rank", str(program)],
                               env=clean_env(**reports.env, PMI_RANK="0"), cwd=tmp_path, stdout=subprocess.PIPE,
                               text=True)
    wait_for(ready.exists, 60, "the program to start")
    assert int(ready.read_text()) != watcher.pid  # the program runs in the watcher's child
    watcher.send_signal(signal.SIGTERM)
    out, _ = watcher.communicate(timeout=60)
    assert (watcher.returncode, out) == (7, "got SIGTERM\n")
    watcher = subprocess.Popen([sys.executable, "-m", "launcher.mpi.rank", str(program)],
                               env=clean_env(**reports.env, PMI_RANK="0"), cwd=tmp_path)
    ready.unlink()
    wait_for(ready.exists, 60, "the program to start again")
    watcher.send_signal(signal.SIGKILL)  # mpirun's last word: the program dies with its watcher
    watcher.wait(60)
    wait_for(lambda: not alive(int(ready.read_text())), 60, "the program to die with its watcher")
    assert reports.received == []


def test_without_a_listener_the_rank_still_fails_at_once(tmp_path):
    with RankReports(socket.AF_INET, "127.0.0.1") as gone:
        pass  # closed: its address now refuses connections
    result = run_rank(tmp_path, gone, "raise RuntimeError('x')\n", PMI_RANK="0")
    assert result.returncode == 1 and "RuntimeError: x" in result.stderr


def test_reports_without_the_token_or_out_of_shape_are_ignored(reports):
    address, port, token = reports.env[rank.REPORT_ENV].split("/")

    def line(**fields) -> bytes:
        fields = {"token": token, "ending": "failed", "rank": 0, "exitCode": 1, **fields}
        return json.dumps({k: v for k, v in fields.items() if v != "-"}, ensure_ascii=False).encode() + b"\n"

    for sent in (line(token="guess"), b"not json\n", line(token="\u00e9t\u00e9"), line(rank="zero"),
                 line(rank=None), line(ending="fine"), line(ending=None),  # no rank; not one of the endings
                 line(ending="-", host="h"),  # the shape before the one report: no ending
                 b'["a list"]\n'):
        with socket.create_connection((address, int(port)), timeout=5) as connection:
            connection.sendall(sent)
            assert connection.recv(16) == b"", sent  # closed without an answer
    assert rank.report(1, None, f"{address}/{port}/wrong") is False
    assert reports.received == []


def test_one_deeply_nested_line_from_a_stranger_does_not_end_the_listener(monkeypatch, reports):
    """Issue 22, row 1: 3,000 '[' with no token made json.loads raise RecursionError, which killed
    the accept thread; every later report was lost."""
    address, port, _ = reports.env[rank.REPORT_ENV].split("/")
    for hostile in (b"[" * 3000 + b"\n", b"{" * 100000 + b"\n", b"\xff\xfe\x00" * 100 + b"\n"):
        with socket.create_connection((address, int(port)), timeout=5) as connection:
            try:
                connection.sendall(hostile)
                answer = connection.recv(16)
            except ConnectionResetError:  # closed with our bytes unread: past its line limit
                answer = b""
            assert answer == b""  # closed without an answer
    monkeypatch.setenv("PMI_RANK", "4")
    assert rank.report(3, "after the strangers", reports.env[rank.REPORT_ENV]) is True
    assert [(r.rank, r.error) for r in reports.received] == [(4, "after the strangers")]


def test_a_peer_dripping_bytes_does_not_hold_the_listener_from_a_failing_rank(monkeypatch, reports):
    """Issue 22, row 6: connections were served one at a time, with a timeout per recv; a peer
    sending a byte every 1.5 s held the listener, and a failing rank's report (it waits 2 s) was
    lost. Now each connection has its own deadline for its first line, and others are served
    meanwhile."""
    address, port, _ = reports.env[rank.REPORT_ENV].split("/")
    dripping = threading.Event()
    stop = threading.Event()

    def drip() -> None:
        with socket.create_connection((address, int(port)), timeout=5) as connection:
            for _ in range(8):
                try:
                    connection.sendall(b" ")
                except OSError:
                    return  # the listener gave up on us: what it should do
                dripping.set()
                if stop.wait(1.5):
                    return

    dripper = threading.Thread(target=drip, daemon=True)
    dripper.start()
    assert dripping.wait(5)
    monkeypatch.setenv("PMI_RANK", "2")
    try:
        assert rank.report(1, "while another peer drips", reports.env[rank.REPORT_ENV]) is True
    finally:
        stop.set()
        dripper.join(10)
    assert [r.rank for r in reports.received] == [2]


def test_reports_keep_their_arrival_order(monkeypatch, reports):
    for number in (7, 3):
        monkeypatch.setenv("PMI_RANK", str(number))
        assert rank.report(1, f"rank {number}", reports.env[rank.REPORT_ENV]) is True
    assert [r.rank for r in reports.received] == [7, 3]


@pytest.mark.parametrize("target", ["", "10.0.0.1", "10.0.0.1/x/token", "a b c"])
def test_a_missing_or_malformed_address_reports_nothing(target):
    assert rank.report(1, None, target) is False


def test_the_address_faces_the_workers_and_is_loopback_when_every_rank_is_here():
    assert ipaddress.ip_address(facing_address(("localhost",), 2222)[1]).is_loopback
    assert facing_address(("no-such-host.invalid",), 2222) == (socket.AF_INET, "127.0.0.1")
    assert facing_address((), 2222) == (socket.AF_INET, "127.0.0.1")


def test_the_rank_runner_imports_nothing_heavy():
    code = ("import sys, launcher.mpi.rank; heavy = [m for m in ('launcher.core.settings', 'pydantic', 'mpi4py', 'torch') "
            "if m in sys.modules]; print(heavy)")
    result = subprocess.run([sys.executable, "-c", code], env=clean_env(), cwd=REPO, capture_output=True,
                            text=True, timeout=60)
    assert result.stdout.strip() == "[]", result.stderr
