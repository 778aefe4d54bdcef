"""Where progress comes from: the in-rank API over a real socket, the relay with the real Kubeflow
SDK, a JSON-lines file, output lines, and the tracker that turns them into percent and ETA."""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone

import pytest

from launcher import progress
from launcher.status.intake import SOCKET_ENV, JsonlTail, ProgressSocket, Relay
from launcher.status.lines import LineParser, Observation
from launcher.status.tracker import Tracker

from conftest import REPO, clean_env


@pytest.fixture
def short_dir():
    # AF_UNIX paths are limited to 107 bytes: pytest's tmp_path can be longer
    path = tempfile.mkdtemp(prefix="lp-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _python(code: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def _receive(listener: ProgressSocket, count: int, timeout: float = 20) -> list[Observation]:
    """Wait on the socket (not on a clock) until ``count`` reports came."""
    found: list[Observation] = []
    deadline = time.monotonic() + timeout
    while len(found) < count and time.monotonic() < deadline:
        ready, _, _ = select.select([listener.fileno()], [], [], max(0.0, deadline - time.monotonic()))
        if ready:
            found.extend(listener.receive())
    return found


# --- the in-rank API -----------------------------------------------------------------------------

def test_report_from_a_rank_process_reaches_the_launcher(short_dir):
    listener = ProgressSocket(os.path.join(short_dir, "p.sock"))
    try:
        done = _python("from launcher import progress\n"
                       "progress.report(step=5, total=10, loss=0.25, lr=1e-4, phase='warmup', bad=float('nan'))",
                       clean_env(**{SOCKET_ENV: listener.path, "RANK": "3"}))
        assert done.returncode == 0, done.stderr
        [seen] = _receive(listener, 1)
    finally:
        listener.close()
    assert (seen.step, seen.total, seen.rank, seen.source) == (5, 10, 3, "api")
    assert seen.metrics == (("loss", "0.25"), ("lr", "0.0001"), ("phase", "warmup"), ("bad", "nan"))


def test_two_ranks_report_with_their_own_rank_and_a_forked_child_reports_too(short_dir):
    listener = ProgressSocket(os.path.join(short_dir, "p.sock"))
    # after a report, the process forks: the child must not write through a state it cannot own
    code = ("import os\nfrom launcher import progress\n"
            "progress.report(step=1)\n"
            "pid = os.fork()\n"
            "if pid == 0:\n    progress.report(step=2)\n    os._exit(0)\n"
            "os.waitpid(pid, 0)\nprogress.report(step=3)\n")
    try:
        ranks = [subprocess.Popen([sys.executable, "-c", code], cwd=REPO,
                                  env=clean_env(**{SOCKET_ENV: listener.path, env_name: str(rank)}))
                 for rank, env_name in ((0, "RANK"), (1, "OMPI_COMM_WORLD_RANK"))]
        assert [rank.wait(timeout=60) for rank in ranks] == [0, 0]
        seen = _receive(listener, 6)
    finally:
        listener.close()
    assert sorted((o.rank, o.step) for o in seen) == [(0, 1), (0, 2), (0, 3), (1, 1), (1, 2), (1, 3)]
    tracker = Tracker()
    for observation in seen:
        tracker.observe(observation, now=1.0)
    assert set(tracker.ranks) == {0, 1}


def test_report_never_blocks_or_raises_without_a_listener(short_dir):
    path = os.path.join(short_dir, "p.sock")
    # nobody at the path, then a listener that never reads (its queue fills: EAGAIN)
    code = ("import time\nfrom launcher import progress\n"
            "t = time.monotonic()\n"
            "for i in range(20000): progress.report(step=i, total=20000, loss=0.5)\n"
            "print(time.monotonic() - t)\n")
    nobody = _python(code, clean_env(**{SOCKET_ENV: path}))
    assert nobody.returncode == 0 and nobody.stderr == "", nobody.stderr
    listener = ProgressSocket(path)
    try:
        full = _python(code, clean_env(**{SOCKET_ENV: path}))
        assert full.returncode == 0 and full.stderr == "", full.stderr
        queued = listener.receive()
    finally:
        listener.close()
    # some reports fit before the queue filled, the rest were dropped without waiting
    assert 0 < len(queued) < 20000
    for run in (nobody, full):
        assert float(run.stdout) < 10, run.stdout  # 20000 calls; a blocking send would hang


def test_report_is_a_no_op_without_the_variable(monkeypatch):
    monkeypatch.delenv(SOCKET_ENV, raising=False)
    assert progress.report(step=1, total=2, loss=0.1) is None


def test_report_reconnects_after_the_launcher_socket_is_replaced(short_dir, monkeypatch):
    path = os.path.join(short_dir, "p.sock")
    monkeypatch.setenv(SOCKET_ENV, path)
    first = ProgressSocket(path)
    progress.report(step=1)
    assert [o.step for o in _receive(first, 1)] == [1]
    first.close()
    progress.report(step=2)  # refused: the socket is gone; dropped, not raised
    second = ProgressSocket(path)
    try:
        seen: list[Observation] = []
        deadline = time.monotonic() + 20
        step = 3
        while not seen and time.monotonic() < deadline:
            progress.report(step=step)  # a new connection is tried after a pause: keep reporting
            ready, _, _ = select.select([second.fileno()], [], [], 0.05)
            if ready:
                seen = second.receive()
            step += 1
    finally:
        second.close()
    assert seen and seen[0].step >= 3


def test_importing_the_api_loads_nothing_heavy():
    done = _python("import sys\nfrom launcher import progress\n"
                   "print(sorted(m for m in ('json', 'socket', 'pydantic', 'torch', 'launcher.core') if m in sys.modules))",
                   clean_env())
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# --- the relay -----------------------------------------------------------------------------------

STATUS_PATH = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/team/trainjobs/tj/status"


@pytest.fixture
def relay():
    relay = Relay(STATUS_PATH)
    relay.start()
    yield relay
    relay.close()


def test_the_real_sdk_update_trainjob_status_reaches_the_relay(relay, tmp_path):
    token = tmp_path / "token"
    token.write_text("projected-token\n")
    done = _python("from kubeflow.trainer import update_trainjob_status\n"
                   "print(update_trainjob_status(progress_percent=42, estimated_remaining_seconds=17,"
                   " metrics={'loss': 0.25, 'current_step': 42, 'total_steps': 100}))",
                   clean_env(KUBEFLOW_TRAINER_SERVER_URL=relay.url, KUBEFLOW_TRAINER_SERVER_TOKEN=str(token)),
                   timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True", done.stderr  # the SDK saw a 200
    [seen] = relay.take()
    assert (seen.percent, seen.eta, seen.step, seen.total, seen.source) == (42, 17, 42, 100, "relay")
    assert seen.metrics == (("loss", "0.25"), ("current_step", "42"), ("total_steps", "100"))
    assert relay.clients == {"kubeflow-sdk"}
    assert relay.take() == []


def test_transformers_own_kubeflow_callback_reaches_the_relay(relay, tmp_path):
    """A real HF Trainer run (tests/programs/hf_trainer.py): with KUBEFLOW_TRAINER_SERVER_URL set
    (the relay's, as the launcher gives its ranks), transformers' KubeflowCallback turns itself on
    and its progress and metrics arrive, as the callback's."""
    token = tmp_path / "token"
    token.write_text("projected-token\n")
    done = subprocess.run([sys.executable, str(REPO / "tests" / "programs" / "hf_trainer.py")], cwd=REPO,
                          env=clean_env(KUBEFLOW_TRAINER_SERVER_URL=relay.url, KUBEFLOW_TRAINER_SERVER_TOKEN=str(token),
                                        OUTPUT_DIR=str(tmp_path / "out")),
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    seen = relay.take()
    assert relay.clients == {"hf-callback"}, relay.clients
    assert seen and seen[-1].percent == 100, seen
    assert any(dict(s.metrics).get("loss") for s in seen), seen


def _post(url: str, body: bytes) -> tuple[int, dict]:
    # what HF's KubeflowCallback sends: urllib, bearer token, JSON
    request = urllib.request.Request(url, data=body, method="POST", headers={
        "Authorization": "Bearer t", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _hf_status(**fields) -> dict:
    return {"trainerStatus": {"lastUpdatedTime": datetime.now(timezone.utc).isoformat(), **fields}}


def test_a_post_shaped_like_the_hf_callback_reaches_the_relay(relay):
    body = _hf_status(progressPercentage=30, estimatedRemainingSeconds=70, metrics=[
        {"name": "loss", "value": "0.5"}, {"name": "current_step", "value": "30"},
        {"name": "total_steps", "value": "100"}, {"name": "current_epoch", "value": "0.3"}])
    code, echo = _post(relay.url, json.dumps(body).encode())
    assert (code, echo) == (200, body)
    [seen] = relay.take()
    assert (seen.percent, seen.eta, seen.step, seen.total) == (30, 70, 30, 100)
    assert relay.clients == {"hf-callback"}


def test_the_relay_reads_the_keys_in_any_case_as_the_status_server_does(relay):
    """The status server decodes bodies with Go's encoding/json, which matches keys without
    regard to case (the exact spelling first): a client writing ``ProgressPercentage`` is heard
    there, so the relay in between must hear it too, and refuse what the server would refuse."""
    now = datetime.now(timezone.utc).isoformat()
    body = {"TrainerStatus": {"LastUpdatedTime": now, "progresspercentage": 40, "ESTIMATEDREMAININGSECONDS": 9,
                              "Metrics": [{"Name": "loss", "VALUE": "0.25"}], "unknownKey": 1}}
    code, echo = _post(relay.url, json.dumps(body).encode())
    assert (code, echo) == (200, body)
    [seen] = relay.take()
    assert (seen.percent, seen.eta, seen.metrics) == (40, 9, (("loss", "0.25"),))

    code, status = _post(relay.url, json.dumps({"TRAINERSTATUS": {"lastUpdatedTime": now,
                                                                   "ProgressPercentage": 150}}).encode())
    assert (code, status["reason"]) == (422, "Invalid") and "progressPercentage" in status["message"]
    assert relay.take() == []


@pytest.mark.parametrize("body, code, reason", [
    (b"{not json", 422, "Invalid"),
    (b"[1, 2]", 422, "Invalid"),
    (json.dumps(_hf_status(progressPercentage=50.5)).encode(), 422, "Invalid"),  # Go wants an int32
    (json.dumps(_hf_status(progressPercentage=150)).encode(), 422, "Invalid"),
    (json.dumps(_hf_status(metrics=[{"name": "x" * 65, "value": "1"}])).encode(), 422, "Invalid"),
    (json.dumps({"trainerStatus": {"progressPercentage": 5}}).encode(), 422, "Invalid"),  # no lastUpdatedTime
    (b'{"trainerStatus": {"lastUpdatedTime": "' + b"x" * 70000 + b'"}}', 413, "RequestEntityTooLarge"),
], ids=["not-json", "a-list", "fractional-progress", "progress-150", "metric-name-of-65", "no-last-updated-time",
        "a-70-kB-body"])  # named, not shown: a body with the time in it differs from one collection to the next
def test_the_relay_refuses_what_the_status_server_refuses(relay, body, code, reason):
    answer, status = _post(relay.url, body)
    assert answer == code
    assert status["status"] == "Failure" and status["reason"] == reason and status["code"] == code
    assert relay.take() == []


def test_the_relay_answers_404_elsewhere_and_keeps_nothing(relay):
    code, status = _post(relay.url.replace("/tj/", "/other/"), json.dumps(_hf_status()).encode())
    assert (code, status["reason"]) == (404, "NotFound")
    assert relay.take() == [] and relay.clients == set()


# --- the JSON-lines file -------------------------------------------------------------------------

def test_jsonl_tail_reads_complete_new_lines_only(tmp_path):
    path = tmp_path / "progress.jsonl"
    missing = JsonlTail(str(path))
    assert missing.read_new() == []  # not written yet: no error
    path.write_text('{"step": 1, "loss": 9}\n')  # before the tail is made: an earlier run's
    tail = JsonlTail(str(path))
    assert tail.read_new() == []
    with open(path, "a") as file:
        file.write('{"step": 2, "total": 10, "rank": 1, "loss": 0.5, "metrics": {"acc": 0.9}}\n{"step": 3, "lo')
        file.flush()
        [first] = tail.read_new()
        assert (first.step, first.total, first.rank, first.source) == (2, 10, 1, "file")
        assert first.metrics == (("loss", "0.5"), ("acc", "0.9"))
        file.write('ss": 0.4}\nnot json\n[1]\n')
        file.flush()
        [second] = tail.read_new()
        assert (second.step, second.metrics) == (3, (("loss", "0.4"),))
    path.write_text('{"step": 1}\n')  # truncated and rewritten: a new run from the start
    assert [o.step for o in tail.read_new()] == [1]
    assert [o.step for o in missing.read_new()] == [1]


# --- output lines --------------------------------------------------------------------------------

M = Observation  # expected observations, source "line"

LINES = [
    # HuggingFace Trainer (ProgressCallback/PrinterCallback print floats as '.4g' strings)
    ("{'loss': '0.6931', 'grad_norm': '1.234', 'learning_rate': '4.5e-05', 'epoch': '0.5'}",
     M(metrics=(("loss", "0.6931"), ("grad_norm", "1.234"), ("learning_rate", "4.5e-05"), ("epoch", "0.5")))),
    ("{'eval_loss': 0.5123, 'eval_runtime': 1.2, 'eval_samples_per_second': 80, 'epoch': 1.0}",
     M(metrics=(("eval_loss", "0.5123"), ("eval_runtime", "1.2"), ("eval_samples_per_second", "80"),
                ("epoch", "1.0")))),
    ("{'train_runtime': '12.34', 'train_loss': '0.5', 'epoch': '3'}",
     M(metrics=(("train_runtime", "12.34"), ("train_loss", "0.5"), ("epoch", "3")))),
    ("[default0]:{'loss': '0.25', 'note': '[String too long to display]', 'epoch': '1'}",
     M(metrics=(("loss", "0.25"), ("epoch", "1")))),
    # tqdm: the last \r segment is what the terminal shows
    (" 45%|####5     | 45/100 [00:10<00:12,  4.50it/s]", M(step=45, total=100)),
    ("  0%|          | 0/100 [00:00<?, ?it/s]\r 10%|#         | 10/100 [00:01<00:09,  9.90it/s]"
     "\r 20%|##        | 20/100 [00:02<00:08,  9.90it/s, loss=0.51]\r", M(step=20, total=100, metrics=(("loss", "0.51"),))),
    ("Epoch 1:  45%|████▌     | 45/100 [00:10<00:12,  4.50it/s]", M(step=45, total=100)),
    # Katib's StdOut convention
    ("2022-01-23T05:19:53Z INFO  Epoch[5] Train-accuracy=0.932769", M(metrics=(("Train-accuracy", "0.932769"),))),
    ("loss=3.0e-02 recall=0.5 precision=.4 Score=-7.53E+05",
     M(metrics=(("loss", "3.0e-02"), ("recall", "0.5"), ("precision", ".4"), ("Score", "-7.53E+05")))),
    ("epoch 1 step=5/100 loss=0.3", M(step=5, total=100, metrics=(("loss", "0.3"),))),
    ("global_step=42, loss = 0.25", M(step=42, metrics=(("loss", "0.25"),))),
    ("iteration=7", M(step=7)),
    # not progress
    ("12/25 meeting notes", None),
    ("PATH=/usr/bin:/usr/local/bin", None),
    ("NCCL_DEBUG=INFO", None),
    ("OMP_NUM_THREADS=1 CUDA_VISIBLE_DEVICES=0", None),
    ("host-0:123:456 [0] NCCL INFO Channel 00/02 :    0   1", None),
    ("host-0:123:456 [0] NCCL INFO NCCL_SOCKET_NTHREADS=4", None),
    ("[W1023 12:00:00.123456 1234 torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1] Watchdog: "
     "WorkNCCL(SeqNum=1, OpType=ALLREDUCE, Timeout(ms)=600000)", None),
    ("[rank0]:[E1023 12:00:00.123456 1234 ProcessGroupGloo.cpp:1] SeqNum=1", None),
    ("I1023 12:00:00.000000 140 torch/distributed/run.py:1] master_port=29500", None),
    ("INFO:torch.distributed.elastic.agent.server.api:  restart_count=0", None),
    ("Namespace(lr=0.1, epochs=10)", None),
    ("version=2.1.0 date=2024-01-01 time=12:30 x=1abc", None),
    ("{'lr': 0.1, 'batch_size': 32}", None),  # a dict, but not the Trainer's
    ("{'loss': __import__('os').system('true')}", None),  # not a literal: never evaluated
    ("config = {'lr': 0.1}", None),
    ("just a line with nothing in it", None),
    ("", None),
]


@pytest.mark.parametrize("text, expected", LINES, ids=[f"{i}:{t[:30]}" for i, (t, _) in enumerate(LINES)])
def test_line_parser_recognises_what_it_should_and_nothing_else(text, expected):
    assert LineParser().parse(text) == expected


def test_line_parser_follows_the_training_bar_not_an_evaluation_bar_inside_it():
    parser = LineParser()
    assert parser.parse(" 40%|####      | 40/100 [00:04<00:06, 10.0it/s]").step == 40
    assert parser.parse(" 50%|#####     | 5/10 [00:00<00:00, 50.0it/s]") is None  # evaluation
    assert parser.parse(" 41%|####1     | 41/100 [00:04<00:06, 10.0it/s]").step == 41
    assert parser.parse("100%|##########| 100/100 [00:10<00:00, 10.0it/s]").step == 100
    assert parser.parse(" 50%|#####     | 5/10 [00:00<00:00, 50.0it/s]").step == 5  # the first bar is done


def test_a_user_regex_fills_step_total_and_metrics():
    import re

    parser = LineParser(re.compile(r"it (?P<step>\d+) of (?P<total>\d+): ppl (?P<perplexity>[\d.]+)"))
    assert parser.parse("[trainer] it 7 of 70: ppl 12.5") == M(step=7, total=70, metrics=(("perplexity", "12.5"),))
    assert parser.parse("loss=0.1").metrics == (("loss", "0.1"),)  # the built-in formats still apply


# --- the tracker ---------------------------------------------------------------------------------

def test_tracker_percent_is_floored_and_capped_until_the_final_status():
    tracker = Tracker()
    assert tracker.percent() is None and tracker.eta(0.0) is None and tracker.first_progress_at is None
    tracker.observe(M(step=1, total=3), now=5.0)
    assert tracker.percent() == 33 and tracker.first_progress_at == 5.0
    tracker.observe(M(step=3, total=3), now=6.0)
    assert tracker.percent() == 99  # 100 means done, and only the final status knows that
    tracker.observe(M(percent=100.0, eta=0.0, source="relay"), now=7.0)
    assert tracker.percent() == 100  # the HF callback's own end is taken as given
    assert (tracker.progressed_at, tracker.first_progress_at) == (7.0, 5.0)


def test_tracker_eta_follows_the_recent_step_rate():
    tracker = Tracker()
    tracker.observe(M(step=0, total=300), now=100.0)
    tracker.observe(M(step=0, total=300), now=101.0)
    assert tracker.eta(101.0) is None  # one distinct step: no rate yet
    tracker.observe(M(step=10), now=110.0)
    assert tracker.eta(110.0) == 290  # 1 step/s, 290 to go
    assert tracker.eta(115.0) == 285  # time passes since the last step
    for t in range(111, 200):  # the pace doubles: the old rate leaves the window
        tracker.observe(M(step=10 + 2 * (t - 110)), now=float(t))
    assert tracker.step == 188 and tracker.eta(199.0) == 56  # 112 steps left at 2 steps/s
    tracker.observe(M(eta=500.0, source="relay"), now=200.0)  # newer than our last step
    assert tracker.eta(210.0) == 490
    tracker.observe(M(step=189), now=211.0)
    assert tracker.eta(211.0) != 490  # our own estimate is newer again
    tracker.observe(M(step=2), now=212.0)  # restarted: a new rate from here
    assert tracker.step == 2 and tracker.eta(212.0) is None


def test_tracker_keeps_latest_metrics_bounded_and_per_rank_steps():
    tracker = Tracker(max_metrics=3)
    tracker.observe(M(metrics=(("loss", "1"), ("acc", "0.1"))), now=1.0)
    tracker.observe(M(metrics=(("lr", "0.1"), ("extra", "x"), ("loss", "0.5"))), now=2.0)
    assert tracker.metrics() == [("loss", "0.5"), ("acc", "0.1"), ("lr", "0.1")]
    tracker.observe(M(step=7, rank=1, source="api"), now=3.0)
    tracker.observe(M(step=9, rank=0, source="api"), now=4.0)
    tracker.observe(M(rank=1, source="api"), now=5.0)  # a heartbeat keeps the rank's step
    assert tracker.ranks == {0: (9, 4.0), 1: (7, 5.0)}
    tracker.observe(M(step=8, rank=1, source="api"), now=6.0)
    assert tracker.step == 9  # the lowest rank's step is the job's: no jumping back to laggards
