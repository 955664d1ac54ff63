"""Never read past a record the broker has not listed yet.

The embedded broker (Tansu on S3) gives each produced batch its offsets first and writes the batch
to S3 after; when two writes finish out of order (a loaded S3 server, or one restarting), a fetch
made in between lists the later batch and not the earlier one. A consumer that takes the record
after the hole moves past the records in it for good: librdkafka never goes back, and faust counts
the offsets it jumped as acked, so stream ops committed past rollout groups it had never read
(`benchmarks/offset_gaps.py`: with half the S3 writes held back up to 0.2 s, a plain live consumer
missed 52 of 1061 records; a stream-ops worker committed past 2 of 691 groups, in a longer run 59
of 1459; the chaos test once lost one).
Broker and S3 restarts also leave offsets that no record ever fills (a batch whose write failed:
its producer sent it again under new offsets).

`OffsetGaps` keeps, per partition, the next offset a consumer should see. A record past it is
held back and the consumer sent back to that offset (`rewind`) until the missing records arrive,
for at most `wait_s` after the record past the hole was produced (its timestamp; the first sight of
the hole where a record has none); after that the offsets are taken as empty, logged and counted.
A late batch is listed within moments of its neighbours, so only a hole at the head of a live topic
is waited for: a replay of an old log passes its empty offsets at once. (The wait runs on the
producer's clock: a consumer whose clock is ahead by more than `wait_s` waits for no hole.) Our topics
are written without transactions, so on any broker their live offsets are
contiguous, and a record past the next offset always means a hole. (A cluster whose producers use
transactions puts a marker at an offset no record fills: set `kafka.gap_wait_s: 0` there.) The
compacted topics the explorers fold whole (admission, task-stats) are read behind it too: a
compacted-away offset lies in a closed segment, so the record past it is rarely younger than the
wait and the hole is passed at once (at worst it costs one wait, never a record).
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Hashable

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Consumer, TopicPartition

log = logging.getLogger(__name__)

REWIND_PAUSE_S = 0.05  # between two rewinds over the same hole: the broker lists it again no faster


class OffsetGaps:
    """Which records a consumer may take: per partition key, the next offset expected."""

    def __init__(self, wait_s: float, clock: Callable[[], float] = time.monotonic, name: str = "consumer",
                 wall: Callable[[], float] = time.time):
        self.wait_s = wait_s
        self.clock, self.wall = clock, wall  # `wall`: the clock of record timestamps (epoch seconds)
        self.name = name
        self.next: dict[Hashable, int] = {}
        self.taken: dict[Hashable, int] = {}  # `take_contiguous`: the newest offset handed out since `expect`
        # key -> (missing offset, first seen, when it is taken as empty), on `clock`
        self.since: dict[Hashable, tuple[int, float, float]] = {}
        self.holes_filled = 0  # holes whose records arrived while we waited
        self.holes_skipped = 0  # holes taken as empty after `wait_s`
        self.offsets_skipped = 0
        self.fill_waits: list[float] = []  # seconds each filled hole took to fill
        self.skip_waits: list[float] = []  # seconds each skipped hole was waited for (0: passed at first sight)

    def expect(self, key: Hashable, offset: int | None) -> None:
        """The consumer was (re)positioned: `offset` comes next (None: whatever comes next)."""
        self.since.pop(key, None)
        self.taken.pop(key, None)
        if offset is None or offset < 0:
            self.next.pop(key, None)
        else:
            self.next[key] = offset

    def forget(self, key: Hashable) -> None:
        self.expect(key, None)

    def rewind(self, key: Hashable, offset: int, produced_s: float | None = None) -> int | None:
        """None: take the record at `offset`. Else the offset to go back to: the record is past a
        hole that may still fill, and neither it nor any later record of the partition may be taken
        now. `produced_s`: the record's timestamp (epoch seconds); None or <= 0 where it has none."""
        expected = self.next.get(key)
        if expected is not None and offset > expected and self.wait_s > 0:
            now = self.clock()
            hole = self.since.get(key)
            if hole is None or hole[0] != expected:
                # the hole's records, if any, were produced before this one: wait from its time
                known = produced_s is not None and produced_s > 0  # aiokafka gives -1 ms for none
                age = min(self.wait_s, max(0.0, self.wall() - produced_s)) if known else 0.0
                hole = self.since[key] = (expected, now, now + self.wait_s - age)
            if now < hole[2]:
                return expected
            self.holes_skipped += 1
            self.offsets_skipped += offset - expected
            self.skip_waits.append(now - hole[1])
            log.warning("%s: offsets %d-%d of %s never appeared (the record after them is %.0f s old): taken as "
                        "empty", self.name, expected, offset - 1, key, self.wait_s + now - hole[2])
        elif key in self.since and expected is not None and offset == expected:
            self.holes_filled += 1
            self.fill_waits.append(self.clock() - self.since[key][1])
        self.since.pop(key, None)
        self.next[key] = offset + 1  # a record before the next offset (a broker redelivery) is taken too
        return None

    def stats(self) -> dict[str, int]:
        return {"offset_holes_filled": self.holes_filled, "offset_holes_skipped": self.holes_skipped,
                "offsets_skipped": self.offsets_skipped}


def assign_guarded(consumer: Consumer, gaps: OffsetGaps, partitions: list[TopicPartition]) -> None:
    """`consumer.assign(partitions)`, each partition expected next at its offset (a logical offset,
    e.g. the group's committed one, expects whatever comes first)."""
    for tp in partitions:
        gaps.expect((tp.topic, tp.partition), tp.offset)
    consumer.assign(partitions)


def take_contiguous(consumer: Consumer, gaps: OffsetGaps, msgs: list) -> list:
    """The records of a `consume`/`poll` result the consumer may take (errors pass through); for a
    partition with a hole, seeks back to it and drops the partition's records after it. A record
    at or below one already taken since the consumer was positioned (`assign_guarded`) is a copy
    the broker sent again (a fetch made while the log keeper swaps small batch objects for a merged
    one) and is dropped."""
    out, rewound, taken = [], set(), gaps.taken
    for m in msgs:
        if m.error() is not None:
            out.append(m)
            continue
        key = (m.topic(), m.partition())
        if key in rewound or m.offset() <= taken.get(key, -1):
            continue
        kind, ms = m.timestamp()
        back = gaps.rewind(key, m.offset(), ms / 1000 if kind != TIMESTAMP_NOT_AVAILABLE else None)
        if back is None:
            out.append(m)
            taken[key] = m.offset()
            continue
        rewound.add(key)
        consumer.seek(TopicPartition(m.topic(), m.partition(), back))
    if rewound:
        time.sleep(REWIND_PAUSE_S)
    return out
