"""Pod 0's XGBoost stop board (launcher/xgboost/board.py) against peers that are not the job's pods.

The board listens on 0.0.0.0 with no token (the XGBoost runtime mounts no Secret), so anything on
the pod network can reach it. It takes a stop record only when it is well formed and comes from
the address of the pod it names; the rest is dropped with one line per peer, and never ends the
job or crashes the launcher. Integration tests run real launcher pods with real xgboost workers
and send the hostile bytes over a real socket; unit tests check the record schema (the launcher's
one stop record, launcher/runner/report.py), the pods' names and the board's lookups in-process."""

from __future__ import annotations

import json
import selectors
import signal
import socket
import sys
import threading
from pathlib import Path

import psutil
import pytest

from conftest import Job, free_port, launcher, needs_root, wait_for, with_private_names
from launcher.core.outcome import Outcome
from launcher.runner.report import StopRecord
from launcher.xgboost import board, stops

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_xgboost import TRAIN, pod_env, reports  # noqa: E402

ATTACK = {"exitCode": 3, "reason": "Failed", "message": "attacker text"}
DROPPED = "xgboost: stop board: ignored what"


def record_of(node_rank: object, outcome: object = None, generation: object = 0, **fields: object) -> dict:
    """A stop record as a pod sends it (StopRecord's JSON), its outcome left out where None."""
    record = {"generation": generation, "nodeRank": node_rank, **fields}
    return record if outcome is None else {**record, "outcome": outcome}


def line_of(record: dict) -> bytes:
    return json.dumps({"stop": record}).encode() + b"\n"


# --- real pods, a hostile peer -------------------------------------------------------------------

def start_pods(tmp_path: Path, out: Path, port: int, argv_of=lambda argv: argv, tracker: str = "127.0.0.1",
               **extra: str) -> list[Job]:
    pods = []
    for index in (0, 1):
        variables = pod_env(out, index, 2, port, **extra)
        variables["DMLC_TRACKER_URI"] = tracker
        pods.append(Job(argv_of(launcher("xgboost", "--", "python", TRAIN)), variables, tmp_path, f"pod{index}"))
    return pods


def free_port_pair() -> int:
    """A free port whose neighbour (the board's) is free too."""
    return free_port(span=1 + board.PORT_OFFSET)


def send_from(source: str, target: str, port: int, data: bytes) -> socket.socket:
    """A peer at ``source`` writes ``data`` to the board; returned open, as a peer would hold it."""
    peer = socket.socket()
    peer.bind((source, 0))
    peer.connect((target, port))
    peer.sendall(data)
    return peer


def until_heard(pod: Job, what: str) -> None:
    """Until ``pod`` says ``what`` (or leaves: then the test's assertions say why)."""
    wait_for(lambda: what in pod.stderr or pod.process.poll() is not None, timeout=60, what=f"{what!r} from pod 0")


def stop(pods: list[Job]) -> list[dict]:
    """SIGTERM every pod, as a user deleting the job would; each pod's termination message."""
    for pod in pods:
        if pod.process.poll() is None:
            pod.signal(signal.SIGTERM)
    for pod in pods:
        pod.wait(60)
    return [pod.termination() for pod in pods]


def assert_survived(pods: list[Job], sender: str) -> None:
    zero = pods[0]
    assert zero.process.poll() is None, f"pod 0 left with {zero.process.returncode}:\n{zero.stderr}"
    assert pods[1].process.poll() is None, f"pod 1 left with {pods[1].process.returncode}:\n{pods[1].stderr}"
    dropped = [line for line in zero.stderr.splitlines() if DROPPED in line]
    assert len(dropped) == 1 and sender in dropped[0], dropped


def assert_ended_by_the_user_only(pods: list[Job]) -> None:
    messages = stop(pods)
    zero = pods[0]
    assert zero.process.returncode == 143, zero.stderr
    assert messages[0]["reason"] == "Terminated", messages[0]
    assert pods[1].process.returncode in (138, 143), pods[1].stderr  # pod 0 went away, or the signal
    for pod, message in zip(pods, messages):
        assert "attacker text" not in json.dumps(message) and "attacker text" not in pod.stderr
        assert "Traceback" not in pod.stderr, pod.stderr


@pytest.fixture
def out(tmp_path: Path) -> Path:
    path = tmp_path / "out"
    path.mkdir()
    return path


@pytest.mark.parametrize("payload", [
    pytest.param(line_of(record_of(9, ATTACK)), id="a-foreign-pods-outcome"),
    pytest.param(b'{"stop":{"generation":0,"nodeRank":1}}\n', id="b-a-record-without-an-outcome"),
    pytest.param(b"[" * 3000 + b"\n", id="c-json-nested-3000-deep"),
    # pod 1's well-formed record from a loopback peer, which a loopback tracker trusts: only its
    # generation (an earlier start's, or a stranger's) keeps it from stopping the job
    pytest.param(line_of(record_of(1, ATTACK, generation=1)), id="d-a-stale-generations-record"),
])
def test_a_hostile_line_to_the_board_neither_ends_the_job_nor_crashes_pod_0(tmp_path, out, payload):
    port = free_port_pair()
    pods = start_pods(tmp_path, out, port, BEHAVIOUR="sleep")
    try:
        wait_for(lambda: len(reports(out)) == 2, timeout=120, what="both workers inside the collective")
        with send_from("127.0.0.7", "127.0.0.1", port + board.PORT_OFFSET, payload + payload):
            until_heard(pods[0], DROPPED)
            assert_survived(pods, "127.0.0.7")
        assert_ended_by_the_user_only(pods)
    finally:
        stop(pods)


def _outside_address() -> str | None:
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family == socket.AF_INET and not address.address.startswith("127."):
                return address.address
    return None


def test_with_a_loopback_tracker_a_peer_from_another_address_is_turned_away(tmp_path, out):
    outside = _outside_address()
    if outside is None:
        pytest.skip("this host has no address but loopback")
    port = free_port_pair()
    pods = start_pods(tmp_path, out, port, BEHAVIOUR="sleep")
    try:
        wait_for(lambda: len(reports(out)) == 2, timeout=120, what="both workers inside the collective")
        record = line_of(record_of(1, ATTACK))
        with send_from(outside, outside, port + board.PORT_OFFSET, record):
            until_heard(pods[0], DROPPED)
            assert_survived(pods, outside)
        assert_ended_by_the_user_only(pods)
    finally:
        stop(pods)


@needs_root
def test_with_the_controllers_names_a_well_formed_record_from_an_address_of_no_pod_is_dropped(tmp_path, out):
    """DMLC_TRACKER_URI in the controller's pattern: the board looks up the pods' names, and a record
    naming pod 1 from an address that is no pod's is dropped; pod 1's own address would be taken."""
    port = free_port_pair()
    wrapped: list[Path] = []

    def private(argv: list[str]) -> list[str]:
        argv, hosts = with_private_names(tmp_path, argv)
        hosts.write_text("127.0.0.1 localhost\n127.0.0.1 tj-node-0-0.tj tj-node-0-1.tj\n")
        wrapped.append(hosts)
        return argv

    pods = start_pods(tmp_path, out, port, private, tracker="tj-node-0-0.tj", BEHAVIOUR="sleep")
    try:
        wait_for(lambda: len(reports(out)) == 2, timeout=120, what="both workers inside the collective")
        record = line_of(record_of(1, ATTACK))
        with send_from("127.0.0.9", "127.0.0.1", port + board.PORT_OFFSET, record):
            until_heard(pods[0], DROPPED)
            assert_survived(pods, "127.0.0.9")
        assert_ended_by_the_user_only(pods)
    finally:
        stop(pods)


def test_a_worker_failing_on_pod_1_still_stops_pod_0_through_the_board_naming_pod_and_task(tmp_path, out):
    port = free_port_pair()
    pods = start_pods(tmp_path, out, port, BEHAVIOUR="exit:3", FAIL_TASK="1")
    try:
        assert pods[1].wait(300) == 3, f"{pods[1].stderr}\npod 0:\n{pods[0].stderr}"
        assert pods[0].wait(120) == 3, pods[0].stderr
        message = pods[0].termination()
        assert (message["reason"], message["causeReason"], message["retryable"]) == ("PeerFailed", "Failed", False)
        assert "task 1" in message["message"] and "pod 1" in message["message"], message["message"]
        assert message["rootCause"]["rank"] == 1
        assert DROPPED not in pods[0].stderr
    finally:
        stop(pods)


# --- the record's schema -------------------------------------------------------------------------

GOOD = {"exitCode": 3, "reason": "Failed", "message": "XGBoost worker (task 1) on h failed", "retryable": False,
        "rootCause": {"node": "h", "rank": 1, "localRank": 0, "exitCode": 3, "signal": None},
        "evidence": "boom", "error": "ValueError: x", "lastLines": ["a", "b"]}


def test_a_well_formed_record_passes_and_reads_back_as_its_outcome():
    sent = record_of(1, GOOD, node="h", rank=1, localRank=0, exitCode=3, error="ValueError: x")
    record = board.check_record(sent, range(1, 3), 0)
    assert (record.generation, record.node_rank, record.node, record.rank, record.exit_code) == (0, 1, "h", 1, 3)
    assert record.to_json() == sent  # what the board sends on is what the pod posted
    assert record.outcome is not None
    outcome = Outcome.from_json(record.outcome)
    assert (outcome.exit_code, outcome.reason, outcome.root_cause.rank) == (3, "Failed", 1)
    assert outcome.extra == {"error": "ValueError: x", "lastLines": ["a", "b"]}


def test_a_long_message_is_cut_to_the_limit():
    record = board.check_record(record_of(1, {**GOOD, "message": "x" * 100_000}, error="y" * 100_000), range(1, 2), 0)
    assert record.outcome is not None and len(record.outcome["message"]) <= board.MESSAGE_LIMIT
    assert record.error is not None and len(record.error) <= 1000


def test_a_record_of_another_generation_is_refused_as_stale():
    for generation, board_generation in ((1, 0), (0, 1), (10**5000, 0)):
        with pytest.raises(board.BadRecord, match="stale"):
            board.check_record(record_of(1, GOOD, generation=generation), range(1, 3), board_generation)
    assert board.check_record(record_of(1, GOOD, generation=1), range(1, 3), 1).generation == 1


HUGE = 10**5000


@pytest.mark.parametrize("value", [
    None, [], "stop", record_of(1), {"outcome": GOOD},
    {"nodeRank": 1, "outcome": GOOD}, record_of(1, GOOD, generation="0"), record_of(1, GOOD, generation=True),
    record_of(1, GOOD, generation=0.0), record_of(1, GOOD, generation=None),
    {"generation": 0, "outcome": GOOD}, {"generation": 0, "pod": 1, "outcome": GOOD},
    record_of(True, GOOD), record_of(0, GOOD), record_of(3, GOOD),
    record_of(-1, GOOD), record_of("1", GOOD), record_of(1.0, GOOD),
    record_of(HUGE, GOOD),
    record_of(1, GOOD, node=5), record_of(1, GOOD, node="n" * 300), record_of(1, GOOD, rank="1"),
    record_of(1, GOOD, localRank=True), record_of(1, GOOD, rank=HUGE), record_of(1, GOOD, exitCode=256),
    record_of(1, GOOD, exitCode=-1), record_of(1, GOOD, exitCode="3"), record_of(1, GOOD, signal=9),
    record_of(1, GOOD, error=["attacker"]),
    record_of(1, "Failed"), record_of(1, {}),
    record_of(1, {**GOOD, "exitCode": 256}), record_of(1, {**GOOD, "exitCode": -1}),
    record_of(1, {**GOOD, "exitCode": "3"}), record_of(1, {**GOOD, "exitCode": True}),
    record_of(1, {**GOOD, "exitCode": 3.0}),
    record_of(1, {k: v for k, v in GOOD.items() if k != "reason"}),
    record_of(1, {**GOOD, "reason": 7}), record_of(1, {**GOOD, "reason": ""}),
    record_of(1, {**GOOD, "reason": "R" * 1000}),
    record_of(1, {k: v for k, v in GOOD.items() if k != "message"}),
    record_of(1, {**GOOD, "message": ["attacker"]}),
    record_of(1, {**GOOD, "evidence": {"x": 1}}),
    record_of(1, {**GOOD, "rootCause": "h"}),
    record_of(1, {**GOOD, "rootCause": {**GOOD["rootCause"], "rank": "1"}}),
    record_of(1, {**GOOD, "rootCause": {**GOOD["rootCause"], "node": 5}}),
], ids=lambda value: "huge-number" if isinstance(value, dict) and HUGE in value.values() else json.dumps(value)[:80])
def test_a_malformed_record_is_refused_in_a_few_words_of_our_own(value):
    with pytest.raises(board.BadRecord) as refused:
        board.check_record(value, range(1, 3), 0)
    said = str(refused.value)
    assert said and len(said) < 120 and "attacker" not in said and "RRRR" not in said


def test_json_nested_too_deep_is_one_dropped_line_and_the_next_line_still_reads():
    buffer = bytearray()
    messages, problems = board._lines(buffer, b"[" * 3000 + b"\n" + b'{"done": true}\n' + b"7\nnot json\n")
    assert messages == [{"done": True}]
    assert len(problems) == 3


# --- the pods' names -----------------------------------------------------------------------------

def test_the_pods_names_follow_the_controllers_pattern_for_pod_0():
    assert board.pod_names("tj-node-0-0.tj", 3) == ("tj-node-0-0.tj", "tj-node-0-1.tj", "tj-node-0-2.tj")
    assert board.pod_names("my-job-node-0-0.my-job.ns.svc.cluster.local", 2) == (
        "my-job-node-0-0.my-job.ns.svc.cluster.local", "my-job-node-0-1.my-job.ns.svc.cluster.local")


@pytest.mark.parametrize("host", ["10.0.0.5", "fd00::5", "tracker.example.com", "tj-node-0-1.tj", "a-node-0-0.b",
                                  "tj-node-0-0", "127.0.0.1", "localhost", ""])
def test_a_tracker_host_outside_the_pattern_gives_no_names(host):
    assert board.pod_names(host, 2) is None


@pytest.mark.parametrize("host, kind", [
    ("tj-node-0-0.tj", "names"), ("127.0.0.1", "loopback"), ("::1", "loopback"), ("[::1]", "loopback"),
    ("localhost", "loopback"), ("10.0.0.5", "anyone"), ("tracker.example.com", "anyone"),
])
def test_who_may_post_follows_from_the_tracker_host(host, kind):
    peers = board.peer_policy(host, 3)
    assert peers.kind == kind
    assert (peers.names is not None) == (kind == "names")


# --- the board in-process, its lookups counted ---------------------------------------------------

class Loop:
    """The supervisor's select loop, in small."""

    def __init__(self):
        self.selector = selectors.DefaultSelector()

    def watch(self, fd, callback):
        self.selector.register(fd, selectors.EVENT_READ, callback)

    def unwatch(self, fd):
        try:
            self.selector.unregister(fd)
        except (KeyError, ValueError):
            pass

    def until(self, predicate, what):
        def step():
            for key, _ in self.selector.select(0.05):
                key.data()
            return predicate()
        wait_for(step, timeout=30, what=what)


ADDRESSES = {"tj-node-0-0.tj": {"127.0.0.1"}, "tj-node-0-1.tj": {"127.0.0.2"}, "tj-node-0-2.tj": {"127.0.0.3"}}


@pytest.fixture
def names_board():
    loop, records, lookups = Loop(), [], []
    gate = threading.Event()

    def resolve(name):
        lookups.append(name)
        gate.wait(30)  # the test decides when the first lookup answers
        return ADDRESSES[name]

    port = free_port()
    served = board.Board(port, False, loop.watch, loop.unwatch, records.append, pods=3,
                         peers=board.peer_policy("tj-node-0-0.tj", 3), resolve=resolve, refresh=3600)
    yield loop, served, port, records, lookups, gate
    gate.set()
    served.close()


def test_a_flood_of_strangers_costs_one_lookup_and_their_records_are_dropped(names_board):
    loop, served, port, records, lookups, gate = names_board
    record = line_of(record_of(1, GOOD))
    strangers = [send_from(f"127.0.1.{i}", "127.0.0.1", port, record) for i in range(1, 31)]
    loop.until(lambda: served.pending == 30, "every stranger's record, waiting on the first lookup")
    gate.set()
    loop.until(lambda: served.dropped == 30, "the strangers' records dropped")
    assert records == [] and served.record is None and served.pending == 0
    assert len(lookups) == 3  # one pass over the three names; the next waits for the refresh interval
    for peer in strangers:
        peer.close()


def test_a_record_from_its_pods_address_is_taken_and_one_naming_another_pod_is_not(names_board):
    loop, served, port, records, lookups, gate = names_board
    gate.set()
    claim_2 = line_of(record_of(2, GOOD))
    with send_from("127.0.0.2", "127.0.0.1", port, claim_2):
        loop.until(lambda: served.dropped == 1, "pod 1's claim to be pod 2, dropped")
    assert records == []
    claim_1 = line_of(record_of(1, GOOD))
    with send_from("127.0.0.2", "127.0.0.1", port, claim_1):
        loop.until(lambda: records, "pod 1's own record")
    assert records[0].node_rank == 1 and records[0].outcome["exitCode"] == 3


def test_the_records_pods_post_pass_the_check_unchanged():
    from launcher.core.outcome import TRANSIENT, RootCause

    hang = Outcome(TRANSIENT, "Hang", "no progress for 600s on h", RootCause(node="h", rank=1),
                   extra={"hang": {"stalledForSeconds": 600, "lastStep": None, "stoppedRanks": [1],
                                   "stacks": {"1": ["train.py:9 in step"]}}, "flightRecorder": ["/tmp/fr-1"]})
    failed = Outcome(3, "Failed", "XGBoost worker (task 4) on h2 failed", RootCause("h2", 4, 1, 3),
                     extra={"error": "ValueError: x"})
    codes = frozenset({138})
    for outcome in (hang, failed):
        record = stops.stop_record(outcome, codes, "h", 2, 0)
        assert board.check_record(json.loads(record.dumps()), range(1, 3), 0) == record
        assert record.outcome == outcome.to_json(codes)
    record = stops.stop_record(failed, codes, "h", 2, 0)
    assert (record.node, record.node_rank, record.rank, record.local_rank, record.exit_code, record.error) == (
        "h2", 2, 4, 1, 3, "ValueError: x")


def test_a_board_client_ignores_what_a_false_board_sends_and_still_takes_a_good_record():
    loop, records, lost = Loop(), [], []
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        client = board.BoardClient("127.0.0.1", server.getsockname()[1], loop.watch, loop.unwatch, records.append,
                                   lambda: lost.append(True), pods=3)
        connection, _ = server.accept()
        with connection:
            stale, good = line_of(record_of(1, ATTACK, generation=1)), line_of(record_of(2, GOOD))
            connection.sendall(b"[" * 3000 + b"\n" + b'{"stop":{"generation":0,"nodeRank":9}}\n' + stale + good)
            loop.until(lambda: records, "the good record")
        client.close()
    assert [record.to_json() for record in records] == [record_of(2, GOOD)] and not lost


def test_a_board_refuses_a_stale_generations_record_and_takes_the_first_of_its_own():
    """A restart's board (generation 1): pod 1's record of the start before is stale; the first
    record of generation 1 wins, and a later one (pod 2's) changes nothing."""
    loop, records = Loop(), []
    port = free_port()
    served = board.Board(port, False, loop.watch, loop.unwatch, records.append, pods=3,
                         peers=board.peer_policy("127.0.0.1", 3), generation=1)
    try:
        with send_from("127.0.0.2", "127.0.0.1", port, line_of(record_of(1, ATTACK, generation=0))):
            loop.until(lambda: served.dropped == 1, "the stale record, dropped")
        assert records == [] and served.record is None
        with send_from("127.0.0.2", "127.0.0.1", port, line_of(record_of(1, GOOD, generation=1))):
            loop.until(lambda: records, "generation 1's record")
        with send_from("127.0.0.3", "127.0.0.1", port, line_of(record_of(2, ATTACK, generation=1))) as late:
            late.shutdown(socket.SHUT_WR)
            loop.until(lambda: served.clients == 0, "pod 2's connection read to its end")
        assert [record.node_rank for record in records] == [1] and served.record == records[0]
        assert served.record.outcome == GOOD
    finally:
        served.close()


def test_a_tracker_named_outside_the_controllers_pattern_is_said_once_at_start(tmp_path, out):
    outside = _outside_address()
    if outside is None:
        pytest.skip("this host has no address but loopback")
    port = free_port_pair()
    job = Job(launcher("xgboost", "--", "python", "-c", "pass"),
              {**pod_env(out, 0, 1, port), "DMLC_TRACKER_URI": outside}, tmp_path)
    assert job.wait(120) == 0, job.stderr
    said = [line for line in job.stderr.splitlines() if "takes a well-formed stop record from any peer" in line]
    assert len(said) == 1 and f"DMLC_TRACKER_URI={outside}" in said[0], job.stderr
