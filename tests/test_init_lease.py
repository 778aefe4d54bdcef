"""Two initializers, one target: the lease in <target>/.trainer-launcher/lease.

Real `python -m launcher init` processes against the in-process Hub (tests/storage_servers.py),
each through its own FaultProxy so the file bodies each one fetched can be counted. A gate at the
holder's proxy keeps it mid-download exactly as long as a test needs (no sleeps). "Another node"
is a holder in another PID namespace (unshare): the waiter cannot see its process, only the file.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import signal
import socket
import subprocess
import threading
from pathlib import Path

import psutil
import pytest
import storage_servers
from conftest import REPO, Job, assert_one_line_naming, clean_env, launcher, needs_root, wait_for
from test_exit_table import assert_agrees

from launcher.initializers import lease as lease_module
from launcher.initializers.lease import Holder, Watch, dead_here

FILES = {"weights.safetensors": os.urandom(2 << 20), "config.json": b'{"a": 1}', "data/part-0.txt": b"x" * 5000}


@pytest.fixture
def repo(hub_server):
    hub_server.add_repo("acme/lease-data", FILES, repo_type="dataset", lfs_paths={"weights.safetensors"})
    return "hf://acme/lease-data"


class Gate:
    """Holds every file body at the proxies until opened; ``held`` counts bodies waiting at it."""

    def __init__(self, monkeypatch):
        self.opened, self.held = threading.Event(), 0
        self.proxies: set[int] = set()
        original = storage_servers._ProxyHandler.send_body
        gate = self

        def send_body(handler, data, fault):
            if handler.server.owner.port in gate.proxies and "/resolve/" in handler.path:
                gate.held += 1
                gate.opened.wait(120)
            original(handler, data, fault)

        monkeypatch.setattr(storage_servers._ProxyHandler, "send_body", send_body)

    def guard(self, proxy) -> None:
        self.proxies.add(proxy.port)


def body_gets(proxy) -> list[str]:
    return [path for method, path, _ in proxy.requests if method == "GET" and "/resolve/" in path]


def start(tmp_path: Path, hub_server, proxy, out: Path, name: str, *prefix: str, **env) -> Job:
    full = clean_env(HF_ENDPOINT=proxy.endpoint, HF_HOME=str(tmp_path / "hf-home"), HF_HUB_DISABLE_XET="1",
                     STORAGE_URI="hf://acme/lease-data", **env)
    return Job([*prefix, *launcher("init", "dataset", "--output", str(out))], full, tmp_path, name)


def holder_of(out: Path) -> Holder | None:
    try:
        return Holder.decode((out / ".trainer-launcher" / "lease").read_bytes())
    except OSError:
        return None


def files_under(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*")
            if p.is_file() and ".trainer-launcher" not in p.parts}


# The TTL of the initializers here. Any value gives the same verdicts: a holder whose heartbeat a
# loaded machine stalls past it (one fsync under CI's load stalled past 1 s, a starved thread past
# 3 s) looks dead, is taken over as it must be, and says so; the tests accept that ending (see
# ended_holding). 3 s keeps it rare, so that most runs check the usual ending in full.
WAITED_TTL = "3"
LOST_AT_RELEASE = "was no longer this initializer's when it released it"


def ended_holding(job: Job, code: int, others: list[Job]) -> bool:
    """True when ``job`` ended holding its lease to the end (0, nothing said of a loss); False when
    one of ``others`` took its lease over because it looked dead, and it said so: 138 LeaseLost
    naming the taker, or 0 with a line when only its release found out (its download was done by
    then). Any other ending fails the test: never two writers unknowingly."""
    if code == 0 and LOST_AT_RELEASE not in job.stderr:
        return True
    if code == 0:
        return False
    message = job.termination()
    assert (code, message["reason"], message["retryable"]) == (138, "LeaseLost", True), job.stderr
    # Its whole line (the termination message is cut to fit) names the taker.
    taken_by = [f"was taken over by {socket.gethostname()} pid {other.pid} " for other in others]
    assert any(name in job.stderr for name in taken_by), job.stderr
    return False


def test_the_second_initializer_waits_then_finds_everything_complete(
    hub_server, repo, fault_proxy, monkeypatch, tmp_path
):
    gate, first_proxy, second_proxy, out = two_initializers(monkeypatch, hub_server, fault_proxy, tmp_path)
    first = start(tmp_path, hub_server, first_proxy, out, "first", LAUNCHER_INIT_LEASE_TTL=WAITED_TTL)
    wait_for(lambda: gate.held > 0, what="the holder mid-download")
    lease = holder_of(out)
    assert lease.pid == first.pid
    second = start(tmp_path, hub_server, second_proxy, out, "second", LAUNCHER_INIT_LEASE_TTL=WAITED_TTL)
    wait_for(lambda: "waiting for the lease held by" in second.stderr, what="the second one waiting")
    assert f"pid {first.pid}" in second.stderr
    # The holder is stuck on its download but alive: its heartbeat goes on, through three TTLs
    # (beats every third of one) unless the machine stalls it past one and the waiter takes over.
    def renewed_or_taken() -> bool:
        now = holder_of(out)
        return "took over" in second.stderr or (now is not None and now.id == lease.id and now.beat >= lease.beat + 9)

    wait_for(renewed_or_taken, what="three TTLs of heartbeats")
    gate.opened.set()
    codes = first.wait(60), second.wait(60)
    assert files_under(out) == FILES
    assert not (out / ".trainer-launcher" / "lease").exists()
    assert codes[1] == 0, second.stderr
    if "took over" in second.stderr:  # the holder looked dead to it (the machine stalled its heartbeat)
        assert not ended_holding(first, codes[0], [second])  # it said so; the taker fetched what was missing
        return
    assert ended_holding(first, codes[0], [second]), first.stderr
    assert body_gets(second_proxy) == []  # it transferred no file body
    assert "fetched 0" in second.stderr and "the lease was released" in second.stderr


def two_initializers(monkeypatch, hub_server, fault_proxy, tmp_path):
    """A gate that holds the first initializer's file bodies, each initializer's own proxy (to
    count what each fetched), and the one target they share."""
    gate = Gate(monkeypatch)
    first_proxy, second_proxy = fault_proxy(hub_server.endpoint), fault_proxy(hub_server.endpoint)
    gate.guard(first_proxy)
    return gate, first_proxy, second_proxy, tmp_path / "dataset"


def kill_a_holder_on_another_node(tmp_path, hub_server, proxy, out, gate) -> Holder:
    """A holder (TTL 2s) SIGKILLed mid-download in another PID namespace, which stands for another
    node: the waiter cannot tell whether it lives. Its lease, as it was left."""
    first = start(tmp_path, hub_server, proxy, out, "first", "unshare", "--pid", "--fork", LAUNCHER_INIT_LEASE_TTL="2")
    wait_for(lambda: gate.held > 0 and holder_of(out) is not None, what="the holder mid-download")
    killed = holder_of(out)
    for process in psutil.Process(first.pid).children(recursive=True):
        process.send_signal(signal.SIGKILL)
    first.wait(30)
    return killed


@needs_root
def test_a_holder_killed_on_another_node_is_taken_over_after_the_ttl(
    hub_server, repo, fault_proxy, monkeypatch, tmp_path
):
    gate, first_proxy, second_proxy, out = two_initializers(monkeypatch, hub_server, fault_proxy, tmp_path)
    killed = kill_a_holder_on_another_node(tmp_path, hub_server, first_proxy, out, gate)
    second = start(tmp_path, hub_server, second_proxy, out, "second", LAUNCHER_INIT_LEASE_TTL="2")
    assert second.wait(60) == 0, second.stderr
    waited = re.search(rf"took over the lease of {re.escape(killed.who())} \(no heartbeat for (\d+)s\)", second.stderr)
    assert waited and int(waited[1]) >= 2, second.stderr  # a whole TTL; more when the machine is slow
    assert "waiting for the lease held by" in second.stderr  # it did wait the TTL out first
    assert files_under(out) == FILES
    gate.opened.set()


def test_a_holder_killed_on_this_node_is_taken_over_at_once(hub_server, repo, fault_proxy, monkeypatch, tmp_path):
    gate, first_proxy, second_proxy, out = two_initializers(monkeypatch, hub_server, fault_proxy, tmp_path)
    first = start(tmp_path, hub_server, first_proxy, out, "first")  # default TTL: 60s
    wait_for(lambda: gate.held > 0, what="the holder mid-download")
    first.signal(signal.SIGKILL)
    first.wait(10)
    second = start(tmp_path, hub_server, second_proxy, out, "second")
    assert second.wait(50) == 0, second.stderr  # well inside the 60s TTL
    assert "its process is gone" in second.stderr
    assert files_under(out) == FILES
    gate.opened.set()


@needs_root
def test_two_waiters_racing_for_a_stale_lease_one_takes_it(hub_server, repo, fault_proxy, monkeypatch, tmp_path):
    gate = Gate(monkeypatch)
    first_proxy = fault_proxy(hub_server.endpoint)
    gate.guard(first_proxy)
    out = tmp_path / "dataset"
    killed = kill_a_holder_on_another_node(tmp_path, hub_server, first_proxy, out, gate)
    proxies = [fault_proxy(hub_server.endpoint) for _ in range(2)]
    waiters = [start(tmp_path, hub_server, proxy, out, f"waiter{i}", LAUNCHER_INIT_LEASE_TTL="2")
               for i, proxy in enumerate(proxies)]
    codes = [w.wait(60) for w in waiters]
    gate.opened.set()
    said = [w.stderr for w in waiters]
    held = [ended_holding(w, code, [o for o in waiters if o is not w]) for w, code in zip(waiters, codes, strict=True)]
    assert any(held), said
    assert files_under(out) == FILES
    assert not (out / ".trainer-launcher" / "lease").exists()
    if all(held):  # the usual ending (else the winner looked dead to the other: the machine stalled it)
        assert sum(f"took over the lease of {killed.who()}" in s for s in said) == 1, said
        fetched = body_gets(proxies[0]) + body_gets(proxies[1])
        assert len(fetched) == len(set(fetched))  # no file fetched by both: the other waited, then found them


def test_waiting_past_the_limit_is_a_retryable_exit_with_one_line(hub_server, repo, fault_proxy, monkeypatch, tmp_path):
    gate, first_proxy, second_proxy, out = two_initializers(monkeypatch, hub_server, fault_proxy, tmp_path)
    first = start(tmp_path, hub_server, first_proxy, out, "first", LAUNCHER_INIT_LEASE_TTL=WAITED_TTL)
    wait_for(lambda: gate.held > 0, what="the holder mid-download")
    second = start(tmp_path, hub_server, second_proxy, out, "second", LAUNCHER_INIT_LEASE_WAIT="2s")
    assert second.wait(60) == 138, second.stderr
    message = second.termination()
    assert (message["exitCode"], message["retryable"], message["reason"]) == (138, True, "LeaseTimeout")
    assert "\n" not in message["message"] and "LAUNCHER_INIT_LEASE_WAIT" in message["message"]
    assert f"pid {first.pid}" in message["message"]
    assert "Traceback" not in second.stderr and body_gets(second_proxy) == []
    gate.opened.set()
    assert first.wait(60) == 0, first.stderr


def test_sigterm_releases_the_lease_and_a_holder_that_lost_it_stops(
    hub_server, repo, fault_proxy, monkeypatch, tmp_path
):
    gate, first_proxy, second_proxy, out = two_initializers(monkeypatch, hub_server, fault_proxy, tmp_path)
    first = start(tmp_path, hub_server, first_proxy, out, "first")
    wait_for(lambda: gate.held > 0, what="the holder mid-download")
    first.signal(signal.SIGTERM)
    assert first.wait(30) == 143
    assert not (out / ".trainer-launcher" / "lease").exists()
    # A holder whose lease another node took over (it looked dead to it) steps down: 138, LeaseLost.
    gate.guard(second_proxy)
    second = start(tmp_path, hub_server, second_proxy, out, "second", LAUNCHER_INIT_LEASE_TTL="1")
    wait_for(lambda: gate.held > 1 and holder_of(out) is not None, what="a new holder mid-download")
    other = Holder("0123456789abcdef", "other-node", 7, 1.0).encode()
    (out / ".trainer-launcher" / "lease.new").write_bytes(other)
    os.replace(out / ".trainer-launcher" / "lease.new", out / ".trainer-launcher" / "lease")
    assert second.wait(30) == 138, second.stderr
    message = second.termination()
    assert (message["reason"], message["retryable"]) == ("LeaseLost", True)
    assert "other-node pid 7" in message["message"]
    assert (out / ".trainer-launcher" / "lease").read_bytes() == other  # not removed: not its own
    gate.opened.set()


@pytest.mark.parametrize(("args", "env", "name", "value"), [
    ((), {"LAUNCHER_INIT_LEASE_TTL": "soon"}, "LAUNCHER_INIT_LEASE_TTL", "soon"),
    ((), {"LAUNCHER_INIT_LEASE_TTL": "0"}, "LAUNCHER_INIT_LEASE_TTL", "0"),
    ((), {"LAUNCHER_INIT_LEASE_TTL": "2h"}, "LAUNCHER_INIT_LEASE_TTL", "2h"),
    ((), {"LAUNCHER_INIT_LEASE_WAIT": "-5"}, "LAUNCHER_INIT_LEASE_WAIT", "-5"),
    (("--lease-wait", "8d"), {}, "--lease-wait", "8d"),
    (("--lease-ttl", " "), {}, "--lease-ttl", " "),
])
def test_bad_lease_knobs_are_one_line_and_exit_2(tmp_path, args, env, name, value):
    source = tmp_path / "source"
    source.mkdir()
    result = subprocess.run(launcher("init", "dataset", "--output", str(tmp_path / "out"), *args),
                            env=clean_env(STORAGE_URI=f"file://{source}", **env), cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    line = assert_one_line_naming(result, name, value)
    assert "duration" in line


def test_lease_failures_agree_with_the_exit_table(tmp_path):
    from launcher.core.outcome import TRANSIENT, Outcome
    from launcher.initializers.errors import failure_outcome
    from launcher.initializers.uri import parse_storage_uri

    outcome = failure_outcome(lease_module.LeaseTimeout("gave up"), parse_storage_uri("hf://acme/x").shown, "/t")
    assert outcome.reason == "LeaseTimeout"
    assert_agrees(outcome, tmp_path, TRANSIENT, True)
    assert_agrees(Outcome(TRANSIENT, "LeaseLost", "taken over"), tmp_path, TRANSIENT, True)


# --- the pure parts ------------------------------------------------------------------------------------


def test_the_lease_says_who_holds_it_and_nothing_else():
    holder = Holder("abc", "node-a", 12, 60.0, 3, "boot/4026531836", "777", "2026-01-01T00:00:00Z")
    assert Holder.decode(holder.encode()) == holder
    assert set(json.loads(holder.encode())) == {"id", "hostname", "pid", "ttl", "beat", "node", "start", "time"}
    assert holder.next().beat == 4 and holder.next().encode() != holder.encode()
    for torn in (b"", b'{"id": "abc", "host', b"[]", b'{"id": 1}', None):
        assert Holder.decode(torn) is None


def test_a_waiter_judges_staleness_by_its_own_clock_only():
    watch = Watch(ttl=10)
    live = Holder("abc", "node-a", 12, 10.0, time="1999-01-01T00:00:00Z")  # a wildly wrong wall clock
    watch.see(live.encode(), now=1000.0)
    assert not watch.stale(1009.9)
    watch.see(live.next().encode(), now=1009.9)  # a heartbeat: the clock restarts
    assert not watch.stale(1019.8) and watch.stale(1019.9)
    assert "node-a pid 12" in watch.line("/t", 1015.0, 15.0, 60.0)
    watch.see(b"", now=1020.0)  # torn or empty reads count as a change, never as staleness
    assert not watch.stale(1029.0)
    assert "seen for 30s" in watch.line("/t", 1030.0, 30.0, 60.0)  # still the same holder


def test_a_holder_with_a_longer_ttl_is_judged_by_its_own():
    watch = Watch(ttl=5)
    watch.see(Holder("abc", "node-a", 12, 60.0).encode(), now=0.0)
    assert not watch.stale(30.0) and watch.stale(60.0)


def test_a_second_claim_only_after_the_first_stayed_taken_for_a_ttl():
    watch = Watch(ttl=10)
    watch.see(Holder("abc", "node-a", 12, 10.0).encode(), now=0.0)
    assert watch.claim_to_try(10.0) == 0
    watch.claim_taken(10.0)  # another waiter won claim 0 ...
    assert watch.claim_to_try(15.0) is None  # ... and is replacing the lease right now
    assert watch.claim_to_try(20.0) == 1  # ... or died doing it: claim 1
    watch.see(Holder("def", "node-b", 13, 10.0).encode(), now=21.0)
    assert watch.claim_to_try(31.0) == 0  # a new lease starts over


def test_a_dead_holder_is_recognised_only_in_our_own_pid_namespace():
    holder = Holder("abc", "node-a", 12, 60.0, node="boot/1", start="500")
    assert dead_here(holder, "boot/1", lambda pid: None)  # no such process
    assert dead_here(holder, "boot/1", lambda pid: "999")  # pid reused by another process
    assert not dead_here(holder, "boot/1", lambda pid: "500")  # alive
    assert not dead_here(holder, "boot/2", lambda pid: None)  # another node: only the TTL decides
    assert not dead_here(Holder("abc", "node-a", 12, 60.0), "boot/1", lambda pid: None)


# --- race-safety of the file operations, with real processes -----------------------------------------


def _race_take_over(directory: str, stale: bytes, barrier, results) -> None:
    me = Holder(os.urandom(8).hex(), "racer", os.getpid(), 60.0).encode()
    barrier.wait()
    fd = lease_module.take_over(directory, stale, 0, me)
    results.put(fd is not None)


def test_racing_takeovers_of_one_stale_lease_have_exactly_one_winner(tmp_path):
    context = multiprocessing.get_context("fork")
    for round_ in range(5):
        directory = tmp_path / f"round{round_}"
        directory.mkdir()
        stale = Holder(f"dead{round_}", "node-x", 1, 60.0).encode()
        (directory / "lease").write_bytes(stale)
        barrier, results = context.Barrier(6), context.Queue()
        racers = [context.Process(target=_race_take_over, args=(str(directory), stale, barrier, results))
                  for _ in range(6)]
        for racer in racers:
            racer.start()
        outcomes = [results.get(timeout=60) for _ in racers]
        for racer in racers:
            racer.join(30)
        assert sorted(outcomes) == [False] * 5 + [True]
        assert Holder.decode((directory / "lease").read_bytes()).hostname == "racer"


# The racers' TTL. Any value gives the same verdict: a holder whose heartbeat the machine stalls
# past it looks dead, is taken over as it must be, says so and stops, and the test accepts that
# ending. 3 s keeps it rare (at 0.6 s, 2 and 3 s CI saw it, on a loaded machine), so that most
# runs check all four holders taking their turns.
RACE_TTL = 3.0


def _append(path: str, line: str) -> None:
    with open(path, "a") as log:  # O_APPEND and one write: the racers' lines never mix
        log.write(line + "\n")


def _hold_in_turn(target: str, log_path: str, barrier) -> None:
    """Take the lease, hold it for more than a TTL of heartbeats between "enter" and "exit", release
    it. A holder that finds its lease taken over (at a beat, or at release) says "lost" and stops at
    once with 99, as an initializer does."""
    pid = os.getpid()

    def lost(why: str) -> None:
        _append(log_path, f"lost {pid} {why}")
        os._exit(99)

    barrier.wait()
    held = lease_module.acquire(target, RACE_TTL, 0, lambda line: _append(log_path, f"said {pid} {line}"), lost)
    _append(log_path, f"enter {pid}")
    start_beat = held.holder.beat
    while held.holder.beat < start_beat + 4:  # hold it for more than a TTL of heartbeats
        threading.Event().wait(0.05)
    _append(log_path, f"exit {pid}")
    held.release()
    if not held.kept:
        lost("at release")


def test_the_full_acquire_loop_is_mutually_exclusive_from_a_stale_start(tmp_path):
    """Four processes race for a stale lease and then for each other's. Each ends holding its lease
    to the end (0) or having said that it lost it (99: it looked dead, to a machine that stalled
    its heartbeat past the TTL). Those that held to the end held one at a time, whatever the load."""
    target = tmp_path / "target"
    (target / ".trainer-launcher").mkdir(parents=True)
    (target / ".trainer-launcher" / "lease").write_bytes(Holder("dead", "node-x", 1, RACE_TTL).encode())
    log_path = tmp_path / "log"
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(4)
    racers = [context.Process(target=_hold_in_turn, args=(str(target), str(log_path), barrier)) for _ in range(4)]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join(120)
    lines = log_path.read_text().splitlines()
    codes = {racer.pid: racer.exitcode for racer in racers}
    kept = {pid for pid, code in codes.items() if code == 0}
    assert set(codes.values()) <= {0, 99} and kept, (codes, lines)
    for pid in codes.keys() - kept:  # it said so: it never wrote on, believing it held the lease
        assert any(line.startswith(f"lost {pid} ") for line in lines), (pid, lines)
    assert not any(line.startswith(f"lost {pid} ") for pid in kept for line in lines), lines
    turns = [line for line in lines if line.split()[0] in ("enter", "exit") and int(line.split()[1]) in kept]
    assert sorted(turns) == sorted(f"{step} {pid}" for pid in kept for step in ("enter", "exit")), lines
    for enter, leave in zip(turns[0::2], turns[1::2], strict=True):  # enter A, exit A, enter B, ...
        assert enter.split()[0] == "enter" and leave == f"exit {enter.split()[1]}", lines
    assert any("took over the lease of node-x pid 1 (no heartbeat for" in line for line in lines), lines
    assert not (target / ".trainer-launcher" / "lease").exists()


def test_renewals_keep_a_waiter_waiting_and_their_end_lets_it_in_a_ttl_later(tmp_path):
    """The whole acquire loop against a clock of the test's own, moved on by each of the waiter's
    sleeps; at those sleeps the holder (the test) renews the lease every third of a TTL, for ten
    TTLs, then stops. No load can delay a renewal here, so the waiter's judgement is checked
    exactly: the racing tests around it run on real time and cannot tell a slow holder from a dead one."""
    ttl = 3.0
    lease = tmp_path / ".trainer-launcher" / "lease"
    lease.parent.mkdir()
    holder = Holder("live", "node-x", 1, ttl)
    lease.write_bytes(holder.encode())
    now, renewed = [0.0], [0.0]

    def sleep(seconds: float) -> None:
        nonlocal holder
        now[0] += seconds
        if now[0] < 10 * ttl and now[0] - renewed[0] >= ttl / 3:
            holder = holder.next()
            lease.write_bytes(holder.encode())
            renewed[0] = now[0]

    said: list[str] = []
    held = lease_module.acquire(str(tmp_path), ttl, 0, said.append, lambda why: said.append(f"lost: {why}"),
                                clock=lambda: now[0], sleep=sleep)
    held.release()
    assert holder.beat >= 20 and renewed[0] >= 9 * ttl  # it waited through every renewal ...
    assert renewed[0] + ttl <= now[0] < renewed[0] + ttl + 1  # ... and went in one TTL after the last
    assert [line for line in said if "took over" in line] == [
        f"{tmp_path}: took over the lease of node-x pid 1 (no heartbeat for {ttl:.0f}s)"
    ], said
    assert held.kept and not lease.exists()


def test_a_release_finds_out_whether_the_lease_was_still_its_own(tmp_path):
    """A holder taken over between two beats (it was paused past the TTL) learns it at release at
    the latest: ``kept`` is False, one line says who holds the lease now, and the taker's lease
    stays. Its own lease, released, is gone. (An hour's TTL: no beat comes in between.)"""
    said: list[str] = []
    mine = lease_module.acquire(str(tmp_path), 3600, 0, said.append, lambda why: said.append(f"lost: {why}"))
    mine.release()
    lease = tmp_path / ".trainer-launcher" / "lease"
    assert mine.kept and not lease.exists() and said == []
    taken = lease_module.acquire(str(tmp_path), 3600, 0, said.append, lambda why: said.append(f"lost: {why}"))
    other = Holder("0123456789abcdef", "other-node", 7, 3600.0).encode()
    (lease.parent / "lease.new").write_bytes(other)
    os.replace(lease.parent / "lease.new", lease)
    taken.release()
    assert taken.kept is False and lease.read_bytes() == other
    assert len(said) == 1 and "no longer this initializer's when it released it (held by other-node pid 7)" in said[0]
