"""A consumer never reads past a record the broker has not listed yet (`infra/offset_gaps.py`).

The logic with hand-driven clocks (the wait runs from the record after the hole's timestamp: a hole
at the head of a live topic is waited for, one in an old log is passed at once); then, on the real stack: the broker's S3 writes slowed at
random (it lists later batches before earlier ones: a plain live consumer skips the late records,
the guarded one delivers every record on the topic), and the broker and its store killed -9
(offsets no record fills: the guarded consumer moves on after its wait).
"""
from __future__ import annotations

import pytest

from streamrft.infra.chaos import read_through_server_kills
from streamrft.infra.offset_gaps import OffsetGaps


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_contiguous_records_are_taken_and_a_hole_rewinds_until_it_fills():
    clock = Clock()
    gaps = OffsetGaps(10.0, clock=clock)
    gaps.expect("p", 5)
    assert [gaps.rewind("p", o) for o in (5, 6, 7)] == [None, None, None]
    assert gaps.rewind("p", 10) == 8  # 8 and 9 not listed yet: back to 8
    clock.t = 3.0
    assert gaps.rewind("p", 10) == 8  # still missing, still waiting
    assert gaps.rewind("p", 8) is None  # the late batch arrived
    assert [gaps.rewind("p", o) for o in (9, 10)] == [None, None]
    assert gaps.stats() == {"offset_holes_filled": 1, "offset_holes_skipped": 0, "offsets_skipped": 0}
    assert gaps.fill_waits == [3.0]


def test_a_hole_that_never_fills_is_taken_as_empty_after_the_wait():
    clock = Clock()
    gaps = OffsetGaps(10.0, clock=clock)
    gaps.expect("p", 0)
    assert gaps.rewind("p", 0) is None
    assert gaps.rewind("p", 4) == 1
    clock.t = 9.9
    assert gaps.rewind("p", 4) == 1
    clock.t = 10.0
    assert gaps.rewind("p", 4) is None  # offsets 1-3 hold no record: move on
    assert gaps.rewind("p", 5) is None
    assert gaps.stats() == {"offset_holes_filled": 0, "offset_holes_skipped": 1, "offsets_skipped": 3}
    # a later hole gets a wait of its own, from when it is first met
    clock.t = 50.0
    assert gaps.rewind("p", 8) == 6
    clock.t = 55.0
    assert gaps.rewind("p", 8) == 6


def test_partitions_are_apart_and_a_new_position_or_a_redelivery_resets_the_expectation():
    gaps = OffsetGaps(10.0, clock=Clock())
    assert gaps.rewind("a", 7) is None  # no expectation yet: whatever comes first
    assert gaps.rewind("b", 0) is None
    assert gaps.rewind("a", 9) == 8
    assert gaps.rewind("b", 1) is None  # b is not held up by a's hole
    gaps.expect("a", 9)  # sought (a rebalance): 9 comes next
    assert gaps.rewind("a", 9) is None
    assert gaps.rewind("a", 3) is None  # the broker delivered again from earlier: taken, 4 next
    assert gaps.rewind("a", 5) == 4
    gaps.forget("a")
    assert gaps.rewind("a", 100) is None


def test_a_wait_of_zero_turns_the_check_off():
    gaps = OffsetGaps(0.0, clock=Clock())
    gaps.expect("p", 0)
    assert gaps.rewind("p", 5) is None
    assert gaps.stats()["offset_holes_skipped"] == 0



def test_the_wait_runs_from_when_the_record_after_the_hole_was_produced():
    clock, wall = Clock(), Clock()
    wall.t = 1000.0
    gaps = OffsetGaps(10.0, clock=clock, wall=wall)
    gaps.expect("p", 0)
    assert gaps.rewind("p", 3, produced_s=996.0) == 0  # produced 4 s ago: 6 s of the wait left
    clock.t, wall.t = 5.9, 1005.9
    assert gaps.rewind("p", 3, produced_s=996.0) == 0
    clock.t, wall.t = 6.0, 1006.0
    assert gaps.rewind("p", 3, produced_s=996.0) is None  # 10 s after it was produced: 0-2 are empty
    assert gaps.stats() == {"offset_holes_filled": 0, "offset_holes_skipped": 1, "offsets_skipped": 3}
    # a replay of an old log: the record after the hole is older than the wait, so the hole is passed at once
    assert gaps.rewind("p", 9, produced_s=100.0) is None
    assert gaps.stats()["offsets_skipped"] == 3 + 5
    # a record from a clock ahead of ours waits the whole wait; no timestamp (None, or aiokafka's -1 ms) too
    for produced in (wall.t + 30, None, -0.001):
        gaps.expect("q", 0)
        assert gaps.rewind("q", 2, produced_s=produced) == 0
        clock.t += 9.9
        wall.t += 9.9
        assert gaps.rewind("q", 2, produced_s=produced) == 0
        clock.t += 0.1
        wall.t += 0.1
        assert gaps.rewind("q", 2, produced_s=produced) is None


@pytest.mark.slow
def test_a_live_consumer_behind_the_guard_gets_the_records_the_broker_lists_late(private_stack):
    """Tansu writes to S3 through a proxy that holds half the PUTs back up to 0.2 s (a loaded S3
    server), under 4 producers: it lists later batches before earlier ones. The plain live consumer
    skips the late records; the one behind the guard delivers every record on the topic."""
    r = read_through_server_kills(private_stack.embedded, private_stack.kafka, "late", seed=1, slow_puts_s=0.2,
                                  duration_s=20, min_holes=3, gap_wait_s=10.0)
    print(f"acked {r.acked}, on the topic {r.on_topic}; holes {r.holes}; guard {r.gaps}, filled after "
          f"{[round(w, 2) for w in r.fill_waits]}; the plain consumer missed {r.missed_raw}")
    assert r.on_topic > 300 and not r.lost and not r.holes
    assert r.gaps["offset_holes_filled"] >= 3 and r.gaps["offset_holes_skipped"] == 0
    assert r.missed_raw, "the plain consumer missed nothing: the proxy did not reorder the broker's writes"
    assert not r.missed_guarded, f"the guarded consumer never delivered offsets {r.missed_guarded}"
    assert not r.replay_missed and r.replay_gaps["offsets_skipped"] == 0


@pytest.mark.slow
def test_offsets_no_record_fills_are_taken_as_empty_after_the_wait(private_stack):
    """Tansu and SeaweedFS killed -9 under 4 producers leave offsets no record fills (a batch whose
    write failed, sent again under new offsets): the guarded consumer waits `gap_wait_s` for each,
    then moves on, and misses no record on the topic. A guarded replay of the topic afterwards
    passes each at once: the record after it is older than the wait."""
    r = read_through_server_kills(private_stack.embedded, private_stack.kafka, "gaps", seed=3, min_kills=4,
                                  max_kills=30, min_holes=1, gap_wait_s=3.0)
    print(f"kills {r.kills}; acked {r.acked}, on the topic {r.on_topic}; holes {r.holes}; guard {r.gaps}, "
          f"filled after {r.fill_waits}; the plain consumer missed {r.missed_raw}")
    assert r.on_topic > 1000 and not r.lost
    assert r.gaps["offset_holes_filled"] + r.gaps["offset_holes_skipped"] >= 1, "no hole met in 30 kills"
    assert r.gaps["offsets_skipped"] <= len(r.holes)  # only offsets that hold no record were passed over
    assert not r.missed_guarded, f"the guarded consumer never delivered offsets {r.missed_guarded}"
    # replayed afterwards, the same empty offsets are old: passed at first sight, none waited for
    print(f"replay: guard {r.replay_gaps}, waited {r.replay_skip_waits}")
    assert not r.replay_missed, f"the replay never delivered offsets {r.replay_missed}"
    assert r.replay_gaps["offsets_skipped"] == len(r.holes) and r.replay_gaps["offset_holes_filled"] == 0
    assert all(w == 0.0 for w in r.replay_skip_waits), r.replay_skip_waits
