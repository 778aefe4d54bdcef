"""The status reporter's contract, its payload rules and its sender, against the real stand-in
server process (tests/status_server.py) over HTTPS with a CA made for the test."""

from __future__ import annotations

import datetime
import http.client
import json
import ssl
import time

import pytest

from launcher.status import payload
from launcher.status.payload import MAX_BODY, MAX_LEN, MAX_METRICS, trainer_status
from launcher.status.sender import Sender
from launcher.status.settings import CA_CERT_ENV, TOKEN_ENV, URL_ENV, StatusEnv, status_env

NOW = datetime.datetime(2026, 5, 1, 12, 30, 45, 123456, tzinfo=datetime.timezone.utc)


def body(percent: int, *metrics: tuple[str, str]) -> dict:
    return trainer_status(percent=percent, eta=100 - percent, metrics=list(metrics), now=NOW)


def post(server, data: dict | bytes, token: str | None = None) -> tuple[int, dict]:
    """One request as any client would send it, with the CA of the test."""
    raw = data if isinstance(data, bytes) else json.dumps(data).encode()
    connection = http.client.HTTPSConnection("127.0.0.1", server.port, timeout=10,
                                             context=ssl.create_default_context(cafile=server.ca_cert))
    try:
        path = server.url.split(str(server.port), 1)[1]
        connection.request("POST", path, body=raw, headers={"Authorization": f"Bearer {token or server.token}",
                                                            "Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


class Lines(list):
    def problems(self) -> list[str]:
        return [text for level, text in self if level == "problem"]

    def recoveries(self) -> list[str]:
        return [text for level, text in self if level == "recovered"]


def sender_for(server, interval: float = 0.2, url: str | None = None) -> tuple[Sender, Lines]:
    lines = Lines()
    env = StatusEnv(url=url or server.url, ca_cert=server.ca_cert, token=server.token_path)
    sender = Sender(env, interval=interval, on_problem=lambda text: lines.append(("problem", text)),
                    on_recovered=lambda text: lines.append(("recovered", text)), backoff=(0.1, 0.4))
    sender.start()
    return sender, lines


def wait_until(predicate, timeout: float = 30, what: str = "condition") -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.02)


# --- the contract: KUBEFLOW_TRAINER_SERVER_* -------------------------------------------------------


@pytest.fixture
def contract(monkeypatch):
    for name in (URL_ENV, CA_CERT_ENV, TOKEN_ENV):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_no_url_means_no_reporting(contract, tmp_path):
    contract.setenv(CA_CERT_ENV, str(tmp_path / "missing.crt"))  # ignored without a URL
    assert status_env() == (None, None)


def test_the_contract_as_upstream_injects_it(contract, status_server):
    for name, value in status_server.env().items():
        contract.setenv(name, value)
    env, problem = status_env()
    assert problem is None
    assert (env.url, env.ca_cert, env.token) == (status_server.url, status_server.ca_cert, status_server.token_path)


@pytest.mark.parametrize("url", ["ftp://server/apis/x", "https://server", "https://server/", "https://server:99999/p",
                                 "https://ser ver/p", "server:8080/apis/x", "https://user:pw@server/p", "https://-bad-/p",
                                 # issue 22, row 9: the bearer token would cross the network in clear
                                 "http://tj-status.kubeflow-system.svc:8080/apis/x"])
def test_a_malformed_url_is_one_warning(contract, status_server, url):
    contract.setenv(URL_ENV, url)
    contract.setenv(TOKEN_ENV, status_server.token_path)
    env, problem = status_env()
    assert env is None
    assert problem.count("\n") == 0 and URL_ENV in problem and repr(url) in problem and "expected" in problem


def test_plain_http_is_taken_only_on_loopback(contract, status_server):
    """The launcher's own relay (and a test stand-in) listen on loopback: no token leaves the pod."""
    contract.setenv(URL_ENV, "http://127.0.0.1:8080/apis/x")
    contract.setenv(TOKEN_ENV, status_server.token_path)
    env, problem = status_env()
    assert problem is None and env.url == "http://127.0.0.1:8080/apis/x"


def test_a_ca_that_is_not_a_file_is_one_warning(contract, status_server, tmp_path):
    contract.setenv(URL_ENV, status_server.url)
    contract.setenv(TOKEN_ENV, status_server.token_path)
    contract.setenv(CA_CERT_ENV, str(tmp_path))  # a directory
    env, problem = status_env()
    assert env is None and CA_CERT_ENV in problem and str(tmp_path) in problem and "readable file" in problem


def test_a_url_without_a_token_is_one_warning(contract, status_server):
    contract.setenv(URL_ENV, status_server.url)
    env, problem = status_env()
    assert env is None and f"{TOKEN_ENV} is unset" in problem


def test_a_token_pasted_instead_of_its_path_is_not_repeated(contract, status_server, tmp_path):
    contract.setenv(URL_ENV, status_server.url)
    contract.setenv(TOKEN_ENV, status_server.token)
    env, problem = status_env()
    assert env is None and TOKEN_ENV in problem and status_server.token not in problem and "***" in problem
    missing = str(tmp_path / "token")  # a plain wrong path is shown, to be fixed
    contract.setenv(TOKEN_ENV, missing)
    assert missing in status_env()[1]


# --- payload: upstream's rules -------------------------------------------------------------------------


def test_metric_names_and_values_fit_upstream_lengths():
    status = trainer_status(percent=None, eta=None, now=NOW, metrics=[
        ("n" * 64, "kept"), ("x" * 65, "dropped"), ("", "dropped"), ("empty", ""),
        ("text", "v" * 65), ("float", "0." + "3" * 70), ("loss", "0.5"), ("loss", "0.25")])["trainerStatus"]
    assert status["metrics"] == [
        {"name": "n" * 64, "value": "kept"},
        {"name": "text", "value": "v" * MAX_LEN},
        {"name": "float", "value": repr(float("0." + "3" * 70))},
        {"name": "loss", "value": "0.25"},  # a repeated name keeps its place, takes the later value
    ]


def test_at_most_256_metrics_the_first_ones():
    status = trainer_status(percent=1, eta=1, now=NOW, metrics=[(f"m{i}", str(i)) for i in range(300)])["trainerStatus"]
    assert len(status["metrics"]) == MAX_METRICS
    assert status["metrics"][-1] == {"name": "m255", "value": "255"}


def test_the_body_stays_within_64_kib():
    wide = "\U0001f600" * 60  # 4 bytes each in UTF-8: 256 such metrics would be ~130 KB
    metrics = [(f"{i:03d}" + wide, wide) for i in range(300)]
    result = trainer_status(percent=50, eta=10, now=NOW, metrics=metrics)
    encoded = payload.encode(result)
    assert len(encoded) <= MAX_BODY
    kept = result["trainerStatus"]["metrics"]
    assert 100 < len(kept) < MAX_METRICS and kept == [{"name": n, "value": v} for n, v in metrics[:len(kept)]]
    more = dict(result, trainerStatus={**result["trainerStatus"], "metrics": kept + [{"name": "x", "value": "y"}]})
    assert len(payload.encode(more)) > MAX_BODY - 200  # it really was filled up to the limit


def test_numbers_are_clamped_and_time_is_utc():
    assert body(150)["trainerStatus"]["progressPercentage"] == 100
    clamp = trainer_status(percent=-5, eta=-3, metrics=[], now=NOW)["trainerStatus"]
    assert clamp["progressPercentage"] == 0 and clamp["estimatedRemainingSeconds"] == 0
    large = trainer_status(percent=99.7, eta=1e12, metrics=[], now=NOW)["trainerStatus"]
    assert large["progressPercentage"] == 99 and large["estimatedRemainingSeconds"] == 2**31 - 1
    assert "progressPercentage" not in trainer_status(percent=float("nan"), eta=None, metrics=[], now=NOW)["trainerStatus"]
    plus_two = datetime.timezone(datetime.timedelta(hours=2))
    local = trainer_status(percent=None, eta=None, metrics=[], now=datetime.datetime(2026, 5, 1, 14, 0, 1, tzinfo=plus_two))
    assert local == {"trainerStatus": {"lastUpdatedTime": "2026-05-01T12:00:01Z"}}


def test_the_server_accepts_what_payload_builds_from_hostile_input(status_server):
    metrics = [("\U0001f600" * 70, "x"), ("é" * 64, "\U0001f600" * 200), *((f"m{i}", "1e-" + "9" * 80) for i in range(400))]
    built = trainer_status(percent=1e9, eta=-1e9, metrics=metrics, now=NOW)
    code, answer = post(status_server, payload.encode(built))
    assert code == 200, answer
    assert answer == built  # echoed as accepted, nothing changed on the way


def test_the_stand_in_refuses_what_upstream_refuses(status_server):
    good = body(10, ("loss", "1"))
    assert post(status_server, {"trainerStatus": {"progressPercentage": 10}}) [0] == 422  # no lastUpdatedTime
    assert post(status_server, {"trainerStatus": {**good["trainerStatus"], "progressPercentage": 10.0}})[0] == 422
    assert post(status_server, {"trainerStatus": {**good["trainerStatus"], "metrics": [{"name": "a" * 65, "value": "1"}]}})[0] == 422
    assert post(status_server, b"{not json")[0] == 422
    code, answer = post(status_server, b" " * (MAX_BODY + 1))
    assert (code, answer["reason"], answer["kind"]) == (413, "RequestEntityTooLarge", "Status")
    assert post(status_server, good, token="wrong")[0] == 403
    assert post(status_server, {})[0] == 200  # no trainerStatus: nothing to apply
    assert post(status_server, {**good, "unknown": 1}) == (200, good)


# --- the sender, through the real server process ---------------------------------------------------------


def test_progress_reaches_the_server(status_server):
    sender, lines = sender_for(status_server)
    update = body(25, ("loss", "0.5"))
    sender.offer(update)
    [record] = status_server.wait_for(lambda records: len(records) == 1, what="one request")
    assert record["code"] == 200 and record["body"] == update and record["user_agent"].startswith("trainer-launcher/")
    wait_until(lambda: sender.sent == 1, what="the sender to read the answer")  # the server records before it answers
    assert sender.close(None) is False and sender.sent == 1 and sender.failed == 0 and lines == []


def test_a_rotated_token_is_picked_up_before_the_next_send(status_server):
    sender, lines = sender_for(status_server)
    sender.offer(body(10))
    status_server.wait_for(lambda records: len(records) == 1)
    old = status_server.token
    status_server.rotate_token()
    assert post(status_server, body(11), token=old)[0] == 403  # the server no longer takes the old one
    sender.offer(body(20))
    records = status_server.wait_for(lambda records: any(r["body"] == body(20) for r in records))
    wait_until(lambda: sender.sent == 2, what="the sender to read the answer")
    mine = [r for r in records if (r["user_agent"] or "").startswith("trainer-launcher/")]
    assert [r["code"] for r in mine] == [200, 200]
    assert mine[0]["token_sha256"] != mine[1]["token_sha256"]
    sender.close(None)
    assert sender.failed == 0 and lines == []


def test_a_refused_update_is_logged_once_and_reporting_goes_on(status_server):
    sender, lines = sender_for(status_server)
    bad = {"trainerStatus": {"progressPercentage": 150, "lastUpdatedTime": "2026-05-01T00:00:00Z"}}
    sender.offer(bad)
    status_server.wait_for(lambda records: len(records) == 1)
    sender.offer(bad)
    status_server.wait_for(lambda records: len(records) == 2)
    huge = {"trainerStatus": {"lastUpdatedTime": "2026-05-01T00:00:00Z", "metrics": [{"name": "n", "value": "v" * MAX_BODY}]}}
    sender.offer(huge)
    sender.offer(huge)
    records = status_server.wait_for(lambda records: len(records) == 3)
    assert [r["code"] for r in records] == [422, 422, 413]
    sender.offer(body(30))
    status_server.wait_for(lambda records: records[-1]["code"] == 200)
    wait_until(lambda: sender.sent == 1, what="the sender to read the answer")
    sender.close(None)
    problems = lines.problems()
    assert len(problems) == 2, problems
    assert "HTTP 422" in problems[0] and "less than or equal to 100" in problems[0]
    assert "HTTP 413" in problems[1] and "Payload too large" in problems[1]
    assert lines.recoveries() == [f"status server {status_server.url} accepts the status again"]


def test_a_down_server_neither_raises_nor_blocks(status_server):
    status_server.kill()  # nothing listens on the port any more
    sender, lines = sender_for(status_server)
    slowest = 0.0
    for step in range(200):
        start = time.perf_counter()
        sender.offer(body(step % 100))
        slowest = max(slowest, time.perf_counter() - start)
    wait_until(lambda: sender.failed >= 3, what="three failed tries")
    assert slowest < 0.05
    assert len(lines.problems()) == 1 and "connection refused" in lines.problems()[0]
    start = time.monotonic()
    assert sender.close(body(100), timeout=1.0) is False
    assert time.monotonic() - start < 1.5


def test_a_server_killed_mid_run_is_retried_until_it_is_back(status_server):
    sender, lines = sender_for(status_server)
    sender.offer(body(10))
    status_server.wait_for(lambda records: len(records) == 1)
    status_server.kill()
    sender.offer(body(20))
    wait_until(lambda: sender.failed >= 2, what="failed tries while the server is down")
    status_server.start()  # the same port
    records = status_server.wait_for(lambda records: records[-1]["body"] == body(20))
    assert records[-1]["code"] == 200
    wait_until(lambda: sender.sent == 2, what="the sender to read the answer")
    sender.close(None)
    assert len(lines.problems()) == 1 and lines.recoveries() == [f"status server {status_server.url} reachable again"]


def test_a_slow_server_does_not_slow_offer(status_server):
    sender, lines = sender_for(status_server)
    status_server.slow(3)
    sender.offer(body(1))
    status_server.wait_for(lambda records: any(r["event"] == "delayed" for r in records), events=True,
                           what="the request to be held by the server")
    start = time.perf_counter()
    for step in range(1000):  # the sender's request is in flight all along
        sender.offer(body(step % 100))
    assert time.perf_counter() - start < 0.2
    status_server.slow(0)
    final = body(100, ("exit_code", "0"))
    start = time.monotonic()
    assert sender.close(final, timeout=2.0) is True
    assert time.monotonic() - start < 2.5
    status_server.wait_for(lambda records: any(r["body"] == final and r["code"] == 200 for r in records))


def test_offers_within_the_interval_give_one_send_of_the_latest(status_server):
    sender, lines = sender_for(status_server, interval=1.0)
    first, second, third = body(1), body(2), body(3)
    sender.offer(first)
    status_server.wait_for(lambda records: len(records) == 1)
    sender.offer(second)
    sender.offer(third)
    records = status_server.wait_for(lambda records: len(records) == 2)
    sender.close(None)
    assert [r["body"] for r in records] == [first, third]
    assert records[1]["time"] - records[0]["time"] >= 0.9


def test_close_sends_the_final_status_at_once(status_server):
    sender, lines = sender_for(status_server, interval=60)
    sender.offer(body(10))
    status_server.wait_for(lambda records: len(records) == 1)
    sender.offer(body(20))  # held back by the 60 s throttle
    final = body(100, ("exit_code", "138"), ("reason", "Hang"))
    start = time.monotonic()
    assert sender.close(final) is True
    assert time.monotonic() - start < 4
    assert [r["body"] for r in status_server.received()] == [body(10), final]
    sender.offer(body(30))  # after close: ignored
    assert sender.sent == 2


def test_the_final_status_is_retried_once(status_server):
    sender, lines = sender_for(status_server, interval=60)
    status_server.fail_next(500)
    assert sender.close(body(100)) is True
    assert [r["code"] for r in status_server.received()] == [500, 200]
    sender, lines = sender_for(status_server, interval=60)
    status_server.fail_next(0, count=5)  # connections dropped without an answer
    assert sender.close(body(100)) is False
    assert [r["code"] for r in status_server.received()][2:] == [0, 0]
    assert len(lines.problems()) == 1


@pytest.mark.unit  # fails at the token, before any connection
def test_a_token_file_that_is_not_text_is_the_token_s_problem(contract, tmp_path):
    """A token file that is not UTF-8 is said as the token's problem, with its path. It was the
    sender's own error ("AttributeError: 'UnicodeDecodeError' object has no attribute
    'strerror'"), logged as an internal one: mypy found it."""
    token = tmp_path / "token"
    token.write_bytes(b"\xff\xfe not a token")
    problems: list[str] = []
    env = StatusEnv(url="http://127.0.0.1:9/apis/status", token=str(token))
    sender = Sender(env, on_problem=problems.append, backoff=(0.1, 0.2))
    assert sender.close(body(1), timeout=3) is False
    assert len(problems) == 1, problems
    assert f"cannot read the token file {token} (" in problems[0] and "utf-8" in problems[0], problems
    assert "AttributeError" not in problems[0]


def test_the_token_never_reaches_the_logs(status_server, capfd):
    """With the default log functions (the launcher's stderr lines): refused, rejected, down."""
    other_job = status_server.url_for("team-a", "someone-else")  # the token's audience is not this job: 403
    env = StatusEnv(url=other_job, ca_cert=status_server.ca_cert, token=status_server.token_path)
    sender = Sender(env, interval=0.1, backoff=(0.1, 0.2))
    sender.start()
    sender.offer(body(1))
    status_server.wait_for(lambda records: records and records[-1]["code"] == 403)
    sender.close(None)
    sender = Sender(StatusEnv(url=status_server.url, ca_cert=status_server.ca_cert, token=status_server.token_path))
    status_server.fail_next(422, message=f"echoing {status_server.token} back")  # a server that misbehaves
    assert sender.close(body(2), timeout=3) is False
    status_server.kill()
    assert sender.close(body(3), timeout=1) is False
    err = capfd.readouterr().err
    assert "HTTP 403" in err and status_server.token_path in err and "HTTP 422" in err and "connection refused" in err
    assert status_server.token not in err


def test_a_server_dripping_its_answer_cannot_hold_a_request_past_its_deadline(status_server, status_certs):
    """Issue 22, row 9: a status server that sends one header byte a second kept each request
    alive (http.client's timeout is per read); the sender was held and later updates, the final
    status included, were lost. Now a request has one deadline for the whole exchange."""
    import socket
    import threading

    ca, cert, key = status_certs
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def drip() -> None:
        connection, _ = listener.accept()
        with context.wrap_socket(connection, server_side=True) as tls:
            tls.recv(65536)  # the request
            for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 100:
                try:
                    tls.sendall(bytes([byte]))
                except OSError:
                    return  # the client gave up: what it should do
                if stop.wait(1.0):
                    return

    dripper = threading.Thread(target=drip, daemon=True)
    dripper.start()
    url = f"https://127.0.0.1:{listener.getsockname()[1]}{status_server.url.split(str(status_server.port), 1)[1]}"
    lines = Lines()
    env = StatusEnv(url=url, ca_cert=str(ca), token=status_server.token_path)
    sender = Sender(env, interval=0.2, on_problem=lambda text: lines.append(("problem", text)),
                    on_recovered=lambda text: None, backoff=(30, 30), request_timeout=2.0)
    sender.start()
    try:
        sender.offer(body(5))
        wait_until(lambda: lines.problems(), timeout=15, what="the dripping request to end at its deadline")
        assert "no answer in time" in lines.problems()[0], lines
    finally:
        stop.set()
        sender.close(None, timeout=1)
        listener.close()
