"""When a job counts as hung (HangWatch over the real Tracker, driven by the test's own clock) and
what the termination message says about it."""

from __future__ import annotations

import json

from launcher.core.outcome import DEFAULT_RETRYABLE_EXIT_CODES, TRANSIENT, Outcome
from launcher.status.hang import Hang, HangWatch, describe, waiting_on_others
from launcher.status.lines import Observation
from launcher.status.stacks import RankStacks
from launcher.status.tracker import Tracker


def seen(tracker: Tracker, now: float, step: int | None = None, rank: int | None = None) -> None:
    tracker.observe(Observation(step=step, rank=rank, source="api" if rank is not None else "line"), now)


def test_off_when_the_timeout_is_zero():
    watch = HangWatch(0, startup=5, started_at=0.0)
    tracker = Tracker()
    seen(tracker, 1.0, step=1)

    assert watch.check(tracker, 10_000.0) is None


def test_before_the_first_progress_only_the_startup_allowance_counts():
    tracker = Tracker()
    unlimited = HangWatch(10, startup=None, started_at=100.0)
    limited = HangWatch(10, startup=60, started_at=100.0)

    assert unlimited.check(tracker, 100_000.0) is None  # a first step may take as long as it takes
    assert limited.check(tracker, 159.0) is None
    hang = limited.check(tracker, 161.0)
    assert hang == Hang(stalled_for=61.0, last_step=None, stopped_ranks=(), before_first_progress=True)


def test_no_progress_for_the_timeout_after_the_first_is_a_hang_with_the_last_step():
    watch = HangWatch(10, startup=None, started_at=0.0)
    tracker = Tracker()
    for second in range(1, 6):
        seen(tracker, float(second), step=second * 10)

    assert watch.check(tracker, 15.0) is None  # 10 s since step 50: not yet
    hang = watch.check(tracker, 15.5)
    assert hang is not None
    assert (hang.stalled_for, hang.last_step, hang.before_first_progress) == (10.5, 50, False)


def test_progress_of_any_kind_keeps_the_job_alive():
    watch = HangWatch(10, startup=None, started_at=0.0)
    tracker = Tracker()
    seen(tracker, 1.0, step=1)
    tracker.observe(Observation(metrics=(("loss", "0.5"),)), 9.0)  # a metric, no step

    assert watch.check(tracker, 18.0) is None
    assert watch.check(tracker, 19.5) is not None


def test_a_rank_silent_for_the_timeout_while_the_others_go_on_is_named():
    watch = HangWatch(10, startup=None, started_at=0.0)
    tracker = Tracker()
    for second in range(0, 16):
        seen(tracker, float(second), step=second, rank=0)
        if second <= 5:
            seen(tracker, float(second), step=second, rank=1)

    assert watch.check(tracker, 15.5) is None  # rank 0 went on for only 10 s after rank 1 stopped
    for second in range(16, 30):
        seen(tracker, float(second), step=second, rank=0)
    hang = watch.check(tracker, 30.0)
    assert hang is not None
    assert hang.stopped_ranks == (1,)
    assert hang.stalled_for == 25.0
    assert hang.last_step == 29  # the job's step (rank 0 leads)


def test_a_rank_that_reports_rarely_but_is_ahead_is_not_hung():
    watch = HangWatch(10, startup=None, started_at=0.0)
    tracker = Tracker()
    seen(tracker, 0.0, step=100, rank=1)  # rank 1 reports once, far ahead
    for second in range(0, 30):
        seen(tracker, float(second), step=second, rank=0)

    assert watch.check(tracker, 30.0) is None


def test_when_everything_stops_the_ranks_behind_are_named():
    watch = HangWatch(10, startup=None, started_at=0.0)
    tracker = Tracker()
    for rank, step in ((0, 41), (1, 40), (2, 41), (3, 40)):
        seen(tracker, 5.0, step=step, rank=rank)

    assert watch.check(tracker, 16.0).stopped_ranks == (1, 3)
    together = Tracker()
    for rank in range(4):
        seen(together, 5.0, step=41, rank=rank)
    assert watch.check(together, 16.0).stopped_ranks == ()  # all at the same step: the stacks tell


def _stacks(rank: int, top: tuple[str, ...]) -> RankStacks:
    return RankStacks(pid=1000 + rank, rank=rank, local_rank=rank, text="...", top=top)


def test_describe_names_ranks_step_stall_and_where_each_rank_is():
    hang = Hang(stalled_for=12.4, last_step=40, stopped_ranks=(1,), before_first_progress=False)
    taken = [
        _stacks(0, ("/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py:3252 in all_reduce",
                    "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py:83 in wrapper",
                    "/job/train.py:10 in step", "/job/train.py:30 in <module>")),
        _stacks(1, ("/job/train.py:13 in <module>",)),
    ]

    message, extra = describe(hang, taken, "tj-node-0-0")

    assert message.startswith("no progress for 12s after step 40 on tj-node-0-0; stopped: rank 1; ")
    # The stopped rank first; a rank inside torch also shows where the program called it.
    assert message.endswith("rank 1 in train.py:13 in <module>; "
                            "rank 0 in distributed_c10d.py:3252 in all_reduce <- train.py:10 in step")
    assert extra == {"hang": {
        "stalledForSeconds": 12, "lastStep": 40, "stoppedRanks": [1], "beforeFirstProgress": False,
        "stacks": {"0": ["distributed_c10d.py:3252 in all_reduce", "c10d_logger.py:83 in wrapper",
                         "train.py:10 in step"],
                   "1": ["train.py:13 in <module>"]},
    }}


def test_a_thousand_ranks_still_fit_the_termination_message_with_their_details():
    hang = Hang(stalled_for=600, last_step=123456, stopped_ranks=tuple(range(0, 1000, 2)), before_first_progress=False)
    frame = "/a/rather/long/path/to/some/module_with_a_long_name.py:12345 in a_function_with_a_long_name"
    taken = [_stacks(rank, (frame,) * 5) for rank in range(1000)]

    message, extra = describe(hang, taken, "node")
    outcome = Outcome(TRANSIENT, "Hang", message, extra=extra)
    text = outcome.termination_message(DEFAULT_RETRYABLE_EXIT_CODES)

    assert len(text.encode()) <= 4096
    data = json.loads(text)
    assert data["hang"]["lastStep"] == 123456  # the details survived: extra was small enough
    assert data["hang"]["stacksOmitted"] > 0
    assert "more ranks in the log" in message


def test_describe_before_the_first_progress_and_without_stacks():
    message, extra = describe(Hang(301, None, (), True), [], None)

    assert message == ("no progress reported in the first 301s (startup allowance); "
                       "no Python stacks (ranks not Python, or gone)")
    assert extra["hang"]["stacks"] == {}


def test_the_rank_outside_the_collective_is_named_when_every_rank_reported_the_same_step():
    hang = Hang(12.0, 5, (), False)
    waiting = _stacks(0, ("/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py:3252 in all_reduce",
                          "/app/train.py:46 in main"))
    stopped = _stacks(1, ("/app/train.py:24 in load_batch", "/app/train.py:40 in main"))
    assert waiting_on_others([waiting, stopped], hang).stopped_ranks == (1,)
    # Nobody in a collective, or everybody: nothing to tell them apart by.
    assert waiting_on_others([stopped], hang).stopped_ranks == ()
    assert waiting_on_others([waiting], hang).stopped_ranks == ()
    # What progress already told wins.
    assert waiting_on_others([waiting, stopped], Hang(12.0, 5, (0,), False)).stopped_ranks == (0,)


def test_a_rank_in_a_compiled_collective_is_known_by_the_source_line_it_waits_on(tmp_path):
    """mpi4py's calls are compiled: the innermost Python frame is the program's own line, and
    that line (read from the file) says it calls a collective."""
    program = tmp_path / "train.py"
    program.write_text("def load_batch():\n    while True: pass\n\ntotal = comm.allreduce(step)\nload_batch()\n")
    hang = Hang(12.0, 5, (), False)
    waiting = _stacks(0, (f"{program}:4 in <module>",))
    stopped = _stacks(1, (f"{program}:2 in load_batch", f"{program}:5 in <module>"))
    assert waiting_on_others([waiting, stopped], hang).stopped_ranks == (1,)
    # Where the file cannot be read, nothing is guessed.
    gone = _stacks(0, (f"{tmp_path}/elsewhere.py:4 in <module>",))
    assert waiting_on_others([gone, stopped], hang).stopped_ranks == ()
