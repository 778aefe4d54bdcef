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
import signal
import subprocess
import threading
from pathlib import Path

import psutil
import pytest

import storage_servers
from conftest import REPO, Job, alive, assert_one_line_naming, clean_env, launcher, needs_root, wait_for
from launcher.initializers import lease as lease_module
from launcher.initializers.lease import Holder, Watch, dead_here
from test_exit_table import assert_agrees

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


# The TTL of a holder another initializer waits on: a beat is a write and an fsync, and under the
# CI's load (image layers committed beside the tests) one fsync stalled past a 1 s TTL, so the
# waiter took over a live holder's lease, as it must for one that looks dead.
WAITED_TTL = "3"


def test_the_second_initializer_waits_then_finds_everything_complete(hub_server, repo, fault_proxy, monkeypatch, tmp_path):
    gate, first_proxy, second_proxy, out = two_initializers(monkeypatch, hub_server, fault_proxy, tmp_path)
    first = start(tmp_path, hub_server, first_proxy, out, "first", LAUNCHER_INIT_LEASE_TTL=WAITED_TTL)
    wait_for(lambda: gate.held > 0, what="the holder mid-download")
    assert holder_of(out).pid == first.pid
    second = start(tmp_path, hub_server, second_proxy, out, "second", LAUNCHER_INIT_LEASE_TTL=WAITED_TTL)
    wait_for(lambda: "waiting for the lease held by" in second.stderr, what="the second one waiting")
    assert f"pid {first.pid}" in second.stderr
    # The holder is stuck on its download but alive: its heartbeat goes on and nobody takes over,
    # through several TTLs (beats every third of one).
    beat = holder_of(out).beat
    wait_for(lambda: (now := holder_of(out)) is not None and now.beat >= beat + 9, what="three TTLs of heartbeats")
    assert holder_of(out).pid == first.pid and alive(second.pid) and "took over" not in second.stderr
    gate.opened.set()
    assert first.wait(60) == 0, first.stderr
    assert second.wait(60) == 0, second.stderr
    assert files_under(out) == FILES
    assert body_gets(second_proxy) == []  # it transferred no file body
    assert "fetched 0" in second.stderr and "the lease was released" in second.stderr
    assert not (out / ".trainer-launcher" / "lease").exists()


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
def test_a_holder_killed_on_another_node_is_taken_over_after_the_ttl(hub_server, repo, fault_proxy, monkeypatch, tmp_path):
    gate, first_proxy, second_proxy, out = two_initializers(monkeypatch, hub_server, fault_proxy, tmp_path)
    killed = kill_a_holder_on_another_node(tmp_path, hub_server, first_proxy, out, gate)
    second = start(tmp_path, hub_server, second_proxy, out, "second", LAUNCHER_INIT_LEASE_TTL="2")
    assert second.wait(60) == 0, second.stderr
    assert f"took over the lease of {killed.who()} (no heartbeat for 2s)" in second.stderr
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
    kill_a_holder_on_another_node(tmp_path, hub_server, first_proxy, out, gate)
    proxies = [fault_proxy(hub_server.endpoint) for _ in range(2)]
    waiters = [start(tmp_path, hub_server, proxy, out, f"waiter{i}", LAUNCHER_INIT_LEASE_TTL="2")
               for i, proxy in enumerate(proxies)]
    assert [w.wait(60) for w in waiters] == [0, 0], [w.stderr for w in waiters]
    assert sum("took over the lease" in w.stderr for w in waiters) == 1, [w.stderr for w in waiters]
    fetched = body_gets(proxies[0]) + body_gets(proxies[1])
    assert len(fetched) == len(set(fetched))  # no file fetched by both
    assert files_under(out) == FILES
    gate.opened.set()


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


def test_sigterm_releases_the_lease_and_a_holder_that_lost_it_stops(hub_server, repo, fault_proxy, monkeypatch, tmp_path):
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
    from launcher.initializers.job import failure_outcome
    from launcher.initializers.uri import parse_storage_uri

    outcome = failure_outcome(lease_module.LeaseTimeout("gave up"), parse_storage_uri("hf://acme/x"), "/t")
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


# Long enough that a holder's heartbeat thread, starved of CPU by a loaded machine (4 test workers
# on 2 cores), still beats within it: at 0.6 s one CI run saw two holders lose the lease this way,
# and at 2.0 s another saw one (exit 99, the loss callback) in the suite's busiest minutes.
RACE_TTL = 3.0


def _hold_in_turn(target: str, log_path: str, barrier) -> None:
    barrier.wait()
    held = lease_module.acquire(target, RACE_TTL, 0, lambda line: None, lambda why: os._exit(99))
    with open(log_path, "a") as log:
        log.write(f"enter {os.getpid()}\n")
    start_beat = held.holder.beat
    while held.holder.beat < start_beat + 4:  # hold it for more than a TTL of heartbeats
        threading.Event().wait(0.05)
    with open(log_path, "a") as log:
        log.write(f"exit {os.getpid()}\n")
    held.release()


def test_the_full_acquire_loop_is_mutually_exclusive_from_a_stale_start(tmp_path):
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
    assert [racer.exitcode for racer in racers] == [0] * 4
    lines = log_path.read_text().split("\n")[:-1]
    assert len(lines) == 8
    for enter, leave in zip(lines[0::2], lines[1::2]):  # strictly nested: enter A, exit A, enter B, ...
        assert enter.split()[0] == "enter" and leave == f"exit {enter.split()[1]}", lines
    assert not (target / ".trainer-launcher" / "lease").exists()
