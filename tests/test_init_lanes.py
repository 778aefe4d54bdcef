"""When the download splits a large file into one more stream, and where that stream starts: the
rule (launcher/initializers/lanes.py) and the bookkeeping (ranges.Segments), on a clock and a byte
count this test drives. The same rule against real servers: test_init_storage.py."""

from __future__ import annotations

from launcher.initializers.lanes import Lanes
from launcher.initializers.ranges import Segments

MIB = 1 << 20


class Link:
    """A server as the lanes see it: ``per_stream`` bytes/s for each stream, ``cap`` in all."""

    def __init__(self, per_stream: float, cap: float = float("inf")):
        self.per_stream, self.cap = per_stream, cap
        self.now, self.bytes = 0.0, 0

    def run(self, lanes: Lanes, seconds: float) -> None:
        self.bytes += int(min(self.per_stream * lanes.busy, self.cap) * seconds)
        self.now += seconds


def lanes_on(link: Link, count: int = 8, streams: int = 1) -> Lanes:
    lanes = Lanes(count, lambda: link.bytes, MIB, clock=lambda: link.now)
    for _ in range(streams):
        lanes.enter()
    return lanes


def grow(link: Link, lanes: Lanes, seconds: float = 30, step: float = 0.05) -> None:
    """Each stream asks for one more every ``step`` (as a stream does at each segment it ends); an
    admitted stream delivers its first chunk one step later."""
    admitted = 0.0
    while link.now < seconds:
        link.run(lanes, step)
        if admitted and link.now >= admitted:
            lanes.flowing()
            admitted = 0.0
        if lanes.split():
            admitted = link.now + step


def test_one_more_stream_is_added_while_each_raises_the_rate_until_the_lanes_are_full():
    link = Link(per_stream=50 * MIB)  # a real S3 endpoint: a rate per connection
    lanes = lanes_on(link, count=8, streams=3)
    grow(link, lanes)
    assert lanes.busy == 8 and lanes.trials == 5 and not lanes.closed


def test_a_server_that_gives_no_more_to_more_streams_gets_one_trial_and_no_more():
    link = Link(per_stream=300 * MIB, cap=600 * MIB)  # moto: one busy process; two streams already fill it
    lanes = lanes_on(link, count=8, streams=2)
    grow(link, lanes)
    assert lanes.trials == 1 and lanes.closed and lanes.busy == 3
    lanes.leave()  # the trial's stream ends: the gate stays shut for the run
    grow(link, lanes, seconds=60)
    assert lanes.trials == 1 and lanes.busy == 2


def test_a_stream_that_brings_less_than_half_an_average_one_ends_the_splitting():
    link = Link(per_stream=40 * MIB, cap=170 * MIB)  # 4 streams: 160; a fifth brings 10, under half of 40
    lanes = lanes_on(link, count=8, streams=4)
    grow(link, lanes)
    assert lanes.closed and lanes.busy == 5


def test_no_split_while_every_lane_is_busy():
    link = Link(per_stream=50 * MIB)
    lanes = lanes_on(link, count=4, streams=4)
    grow(link, lanes)
    assert lanes.trials == 0 and lanes.busy == 4


def test_a_stream_that_starts_or_ends_voids_the_window_and_the_trial():
    """A file done (or the next begun) changes the rate for a reason no trial caused: the window
    starts again, so a slower download after a file ended never closes the gate."""
    link = Link(per_stream=50 * MIB)
    lanes = lanes_on(link, count=8, streams=3)
    link.run(lanes, 0.05)
    assert not lanes.split()  # the window opens
    link.run(lanes, 1.0)
    assert lanes.split()  # the first trial: 3 -> 4 streams
    link.run(lanes, 0.05)
    lanes.flowing()
    lanes.leave()
    lanes.leave()  # two files end during the trial: 2 streams, half the rate it was compared with
    link.run(lanes, 1.0)
    assert not lanes.split() and not lanes.closed  # void: a new window, not a verdict
    link.run(lanes, 1.0)
    assert lanes.split() and lanes.busy == 3


def test_a_trial_is_measured_from_its_streams_first_chunk_not_from_the_request():
    link = Link(per_stream=50 * MIB)
    lanes = lanes_on(link, count=8, streams=1)
    link.run(lanes, 0.05)
    lanes.split()
    link.run(lanes, 1.0)
    assert lanes.split()
    busy = lanes.busy
    link.now += 2.0  # the new stream's first byte takes 2 s: no bytes, no verdict meanwhile
    assert not lanes.split() and not lanes.closed and lanes.busy == busy
    lanes.flowing()
    link.run(lanes, 1.0)
    assert lanes.split()  # measured from its first chunk: two streams, twice the rate


def segments(size_mib: int, done=(), claimed=()) -> Segments:
    found = Segments(size_mib * MIB, MIB, {o * MIB for o in done})
    found.claimed |= {o * MIB for o in claimed}
    return found


def test_a_new_stream_takes_the_second_half_of_the_longest_run_a_stream_is_reading_toward():
    s = segments(10, claimed=[0])  # one stream reading from 0: 1..9 unclaimed
    assert s.take_over() == 5 * MIB and s.run_end(5 * MIB) == 10 * MIB
    s.claimed.add(5 * MIB)
    assert s.next(0, s.size) == MIB  # the first stream goes on...
    assert s.next(4 * MIB, s.size) is None  # ...and stops where the taken half begins


def test_a_gap_a_resume_left_is_taken_from_its_start():
    s = segments(10, done=[0, 1, 2], claimed=[7])  # 3..6 unclaimed, nobody reading toward them
    assert s.take_over() == 3 * MIB
    assert s.first_free() == 3 * MIB and s.run_end(3 * MIB) == 7 * MIB


def test_a_run_a_stream_is_reading_toward_is_not_free_only_a_gap_is():
    # The file's own stream, done with its run, must not take the rest of another stream's: that
    # is one more GET for no more streams (a split is the lanes' to decide).
    s = segments(10, done=[0, 1, 2, 3, 4], claimed=[5, 6])  # a stream at 6 reads toward 7..9
    assert s.first_free() is None
    s.done |= {5 * MIB, 6 * MIB}  # it stopped after 6 (its request ended there): 7..9 is a gap
    assert s.first_free() == 7 * MIB


def test_a_run_of_one_segment_is_not_split_and_the_last_segment_may_be_short():
    s = Segments(3 * MIB + 10, MIB, set())
    s.claimed |= {0, 2 * MIB}
    assert s.take_over() is None  # 1 alone
    s = Segments(3 * MIB + 10, MIB, set())
    s.claimed.add(0)
    assert list(s.offsets()) == [0, MIB, 2 * MIB, 3 * MIB]
    assert s.take_over() == 2 * MIB and s.run_end(2 * MIB) == 3 * MIB + 10
