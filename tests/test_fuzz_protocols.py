"""The launcher's wire protocols, fuzzed against real servers on real sockets: the MPI rank-report
listener and the stack board (TCP, token first line), the progress datagram socket, the status
relay (HTTP) and the formats of progress lines and the JSON-lines file.

The property everywhere: a peer's bytes, whatever they are, are answered or dropped; they never
end the server, never stop the next honest peer from being heard, and never raise in the
launcher.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import tempfile
import time
import urllib.parse

import pytest
from hypothesis import example, given, strategies as st

from fuzz import hostile_bytes
from launcher.mpi.rank import REPORT_ENV, report
from launcher.mpi.reports import RankReports, rank_report
from launcher.status import intake
from launcher.status.board import StackBoard
from launcher.status.lines import LineParser, Observation
from launcher.status.stacks import BOARD_ENV

pytestmark = pytest.mark.fuzz

JSON_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3),
    max_leaves=8)


def wait_for(condition, what: str, timeout: float = 10.0):
    """Poll ``condition`` until it holds (the servers answer from their own threads)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if value := condition():
            return value
        time.sleep(0.005)
    raise AssertionError(f"gave up waiting for {what}")


def send_and_close(address: tuple[str, int], data: bytes) -> None:
    with socket.create_connection(address, timeout=2) as peer:
        try:
            peer.sendall(data)
            peer.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the server may hang up first: that is one of its answers


# --- the rank-report listener ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def reports():
    saved = os.environ.get("PMI_RANK")
    os.environ["PMI_RANK"] = "1"  # the honest rank's number, as MPICH's mpirun gives it
    with RankReports(socket.AF_INET, "127.0.0.1") as listener:
        yield listener
    if saved is None:
        del os.environ["PMI_RANK"]
    else:
        os.environ["PMI_RANK"] = saved


def _address(env: dict[str, str], name: str) -> tuple[tuple[str, int], str]:
    host, port, token = env[name].split("/")
    return (host, int(port)), token


@given(data=st.data())
@example(data=None)
def test_no_peer_stops_the_rank_reports_from_reaching_the_launcher(reports, data):
    address, token = _address(reports.env, REPORT_ENV)
    if data is None:
        hostile = b"[" * 3000 + b"\n"
    else:
        hostile = data.draw(hostile_bytes() | JSON_VALUE.map(
            lambda value: json.dumps({"token": token, "ending": "failed", "rank": value, "exitCode": value, "node": value,
                                      "localRank": value, "error": value}).encode() + b"\n"))
    send_and_close(address, hostile)
    before = len(reports.received)
    # A real rank's report, as launcher.mpi.rank sends it, still gets through.
    assert report(3, "boom", reports.env[REPORT_ENV]), "the launcher did not take an honest rank's report"
    received = wait_for(lambda: reports.received[before:] or None, "the honest report")
    assert any(r.exit_code == 3 and r.error == "boom" for r in received)
    for kept in reports.received:  # whatever was kept is typed as the launcher reads it
        _assert_typed(kept)


def _assert_typed(kept) -> None:
    assert type(kept.rank) is int
    assert kept.exit_code is None or type(kept.exit_code) is int
    assert kept.local_rank is None or type(kept.local_rank) is int
    assert all(text is None or isinstance(text, str) for text in (kept.node, kept.error, kept.where, kept.reason))


@given(JSON_VALUE | st.dictionaries(st.sampled_from(["ending", "rank", "localRank", "node", "exitCode", "error"]),
                                    JSON_VALUE | st.sampled_from(["failed", "crashed"])))
def test_any_decoded_report_is_a_typed_report_or_nothing(value):
    kept = rank_report(value)
    if kept is not None:
        _assert_typed(kept)


# --- the stack board -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def board():
    with StackBoard(socket.AF_INET, "127.0.0.1") as listener:
        yield listener


@given(hello=hostile_bytes(), answer=hostile_bytes(max_size=2048) | st.integers(1, 20000).map(lambda d: b"[" * d + b"\n"))
def test_no_rank_stops_the_stack_board_from_collecting(board, hello, answer):
    address, token = _address(board.env, BOARD_ENV)
    send_and_close(address, hello)  # a stranger's first line
    # A rank that says who it is, then answers the request with anything at all.
    with socket.create_connection(address, timeout=2) as rank:
        rank.sendall(json.dumps({"token": token, "pid": 4242, "rank": 1}).encode() + b"\n")
        wait_for(lambda: board.connected >= 1, "the rank on the board")
        import threading

        def answer_once():
            try:
                rank.settimeout(5)
                if rank.recv(16).startswith(b"dump"):
                    rank.sendall(answer)
                    rank.shutdown(socket.SHUT_WR)
            except OSError:
                pass

        responder = threading.Thread(target=answer_once)
        responder.start()
        stacks = board.collect(wait=3.0)
        responder.join()
    assert all(isinstance(s.text, str) and s.text for s in stacks)
    board.collect(wait=1.0)  # the rank hung up: asked again, it is dropped, and nothing is left over
    assert board.connected == 0


# --- the progress datagram socket ------------------------------------------------------------------


@pytest.fixture(scope="module")
def progress_socket():
    directory = tempfile.mkdtemp(prefix="fuzz-progress-")
    listener = intake.ProgressSocket(os.path.join(directory, "progress.sock"))
    yield listener
    listener.close()


@given(st.lists(hostile_bytes() | JSON_VALUE.map(lambda v: json.dumps({"step": v, "total": v, "metrics": v}).encode()),
                max_size=5))
def test_no_datagram_hides_the_next_progress_report(progress_socket, datagrams):
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as rank:
        for datagram in [*datagrams, json.dumps({"step": 7, "total": 10, "metrics": {"loss": 0.5}}).encode()]:
            rank.sendto(datagram, progress_socket.path)
    seen = progress_socket.receive()
    assert all(isinstance(o, Observation) for o in seen)
    assert seen and seen[-1].step == 7 and seen[-1].total == 10 and ("loss", "0.5") in seen[-1].metrics
    for observation in seen:
        assert observation.step is None or (isinstance(observation.step, int) and observation.step >= 0)
        assert all(isinstance(n, str) and isinstance(v, str) for n, v in observation.metrics)


# --- the status relay (HTTP) ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def relay():
    server = intake.Relay("/apis/trainer.kubeflow.org/v1alpha1/namespaces/ns/trainjobs/tj/status")
    server.start()
    yield server
    server.close()


def post(relay: intake.Relay, body: bytes, path: str | None = None, length: str | None = None) -> tuple[int, bytes]:
    host, port = relay.url.split("//", 1)[1].split("/", 1)[0].split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        connection.putrequest("POST", path or relay.path)
        connection.putheader("Content-Type", "application/json")
        connection.putheader("Content-Length", length if length is not None else str(len(body)))
        connection.endheaders(body)
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()


STATUS = st.fixed_dictionaries({}, optional={
    "progressPercentage": st.integers(-5, 105) | JSON_VALUE,
    "estimatedRemainingSeconds": st.integers(-5, 2 ** 32) | JSON_VALUE,
    "metrics": st.lists(st.fixed_dictionaries({}, optional={"name": st.text(max_size=70) | JSON_VALUE,
                                                              "value": st.text(max_size=70) | JSON_VALUE}),
                        max_size=4) | JSON_VALUE,
    "lastUpdatedTime": st.sampled_from(["2026-11-26T07:00:00Z", "2026-11-26", "yesterday", ""]) | JSON_VALUE,
})


def _recased(draw_case, obj):
    """``obj`` with its keys in whatever case ``draw_case`` picks: Go's decoder, and so the status
    server and the relay, match keys without regard to case."""
    if isinstance(obj, dict):
        return {draw_case(key): _recased(draw_case, value) for key, value in obj.items()}
    if isinstance(obj, list):
        return [_recased(draw_case, item) for item in obj]
    return obj


@st.composite
def recased(draw, strategy):
    return _recased(lambda key: draw(st.sampled_from([key, key.upper(), key.lower(), key.capitalize()])),
                    draw(strategy))


@given(st.one_of(STATUS.map(lambda s: json.dumps({"trainerStatus": s}).encode()),
                 recased(STATUS.map(lambda s: {"trainerStatus": s})).map(lambda r: json.dumps(r).encode()),
                 JSON_VALUE.map(lambda v: json.dumps(v).encode()),
                 hostile_bytes()))
@example(b"[" * 5000)
def test_the_relay_answers_any_body_like_the_status_server_and_keeps_only_valid_status(relay, body):
    status, answer = post(relay, body)
    assert status in (200, 413, 422), (status, answer)
    document = json.loads(answer)
    assert isinstance(document, dict)
    if status == 200:
        request = json.loads(body)
        sent = intake._go_fields(request, ("trainerStatus",)).get("trainerStatus") if isinstance(request, dict) else None
        if sent is not None:
            assert intake._invalid(sent) is None
    for observation in relay.take():
        assert observation.percent is None or 0 <= observation.percent <= 100
        assert all(1 <= len(n) <= 64 and 1 <= len(v) <= 64 for n, v in observation.metrics)


REQUEST_HEAD = st.one_of(
    st.binary(max_size=200),
    st.tuples(st.sampled_from(["POST", "GET", "PUT", "BREW", ""]), st.text(max_size=30),
              st.sampled_from(["-1", "abc", "", "99999999999", "70000", "5", "0x10"]))
    .map(lambda r: f"{r[0]} /{urllib.parse.quote(r[1])} HTTP/1.1\r\nContent-Length: {r[2]}\r\n\r\n{{}}".encode()),
)


@given(REQUEST_HEAD)
@example(b"POST / HTTP/1.1\r\nContent-Length: 70000\r\n\r\n{}")  # a body promised, never sent
def test_a_malformed_request_never_stops_the_relay_answering_the_next_rank(relay, request):
    with socket.create_connection(("127.0.0.1", int(relay.url.split(":")[2].split("/")[0])), timeout=2) as peer:
        peer.sendall(request)  # and leave it half-done: the relay answers, or waits on it alone
        status, _ = post(relay, json.dumps({"trainerStatus": {"progressPercentage": 42,
                                                              "lastUpdatedTime": "2026-11-26T07:00:00Z"}}).encode())
    assert status == 200
    assert any(o.percent == 42 for o in relay.take())


# --- progress lines and the JSON-lines file -------------------------------------------------------


@given(st.one_of(st.text(max_size=200),
                 st.lists(st.tuples(st.sampled_from(["step", "loss", "global_step", "total_steps", "epoch", "x"]),
                                    st.text(max_size=8) | st.integers().map(str)), max_size=5)
                 .map(lambda pairs: " ".join(f"{k}={v}" for k, v in pairs)),
                 st.text(max_size=40).map(lambda t: f"{t} 45%|####      | 45/100 [00:10<00:12, 4.50it/s, loss={t}]"),
                 st.dictionaries(st.text(max_size=10), JSON_VALUE, max_size=4).map(str)))
@example("{'loss': '0.6931', 'grad_norm': '1.23', 'learning_rate': '5e-05', 'epoch': '0.5'}")
@example("step=" + "9" * 5000)
def test_any_output_line_gives_a_sane_observation_or_none(line):
    observation = LineParser().parse(line)
    if observation is None:
        return
    assert observation.step is None or observation.step >= 0
    assert observation.total is None or observation.total >= 0
    assert all(isinstance(n, str) and isinstance(v, str) for n, v in observation.metrics)


@given(st.lists(hostile_bytes().map(lambda b: b + b"\n")
                | JSON_VALUE.map(lambda v: json.dumps({"step": v, "metrics": v}).encode() + b"\n"), max_size=6))
def test_any_progress_file_content_is_read_without_raising(tmp_path_factory, chunks):
    path = tmp_path_factory.mktemp("jsonl") / "progress.jsonl"
    path.write_bytes(b"")
    tail = intake.JsonlTail(str(path))
    with open(path, "ab") as program:
        for chunk in chunks:
            program.write(chunk)
        program.write(b'{"step": 5, "total": 9}\n')
    seen = tail.read_new()
    assert seen and seen[-1].step == 5 and seen[-1].total == 9


# --- the XGBoost stop board's records --------------------------------------------------------------

OUTCOME = st.fixed_dictionaries({}, optional={
    "exitCode": st.integers(-1, 300) | JSON_VALUE, "reason": st.text(max_size=80) | JSON_VALUE,
    "message": st.text(max_size=3000) | JSON_VALUE, "evidence": JSON_VALUE, "rootCause": JSON_VALUE,
    "retryable": JSON_VALUE, "extra": JSON_VALUE})


SMALL_INT = st.integers(-2, 300) | JSON_VALUE


@given(st.fixed_dictionaries({}, optional={
    "generation": st.integers(-1, 2) | JSON_VALUE, "nodeRank": st.integers(-2, 6) | JSON_VALUE,
    "node": st.text(max_size=300) | JSON_VALUE, "rank": SMALL_INT, "localRank": SMALL_INT, "exitCode": SMALL_INT,
    "signal": st.text(max_size=12) | JSON_VALUE, "error": st.text(max_size=3000) | JSON_VALUE,
    "outcome": OUTCOME | JSON_VALUE}) | JSON_VALUE)
@example({"generation": 0, "nodeRank": 2, "node": "", "rank": 5, "exitCode": 3, "error": "e" * 3000,
          "outcome": {"exitCode": 3, "reason": "Failed", "message": "m" * 3000, "evidence": "x" * 900}})
def test_a_stop_record_is_one_every_pod_can_act_on_or_it_is_refused(value):
    from launcher.core.outcome import Outcome
    from launcher.runner.report import TEXT_LIMIT
    from launcher.xgboost.board import MESSAGE_LIMIT, BadRecord, check_record

    try:
        record = check_record(value, range(1, 4), 0)
    except BadRecord as refusal:
        assert "\n" not in str(refusal)
        return
    assert record.outcome is not None
    outcome = Outcome.from_json(record.outcome)
    assert record.generation == 0 and record.node_rank in range(1, 4) and 0 <= outcome.exit_code <= 255
    assert record.exit_code is None or 0 <= record.exit_code <= 255
    assert len(outcome.message) <= MESSAGE_LIMIT and (record.error is None or len(record.error) <= TEXT_LIMIT)
    # pod 0's board sends on what it took; every other pod reads it back the same
    assert check_record(json.loads(record.dumps()), range(4), 0) == record


@given(st.lists(hostile_bytes(), max_size=6))
def test_any_bytes_on_the_stop_board_are_split_into_objects_or_dropped(chunks):
    from launcher.xgboost.board import _lines

    buffer = bytearray()
    for chunk in chunks:
        messages, problems = _lines(buffer, chunk)
        assert all(isinstance(m, dict) for m in messages) and all(isinstance(p, str) for p in problems)
