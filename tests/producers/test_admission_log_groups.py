"""`AdmissionLog.open_group` on the real stack: concurrent openings share reservation records and
are granted in order exactly as far as the room goes; another process's ledger sees the gateway's
open groups; closing a group moves it from in flight to produced; a decision bounds new groups by
the deciding process's own oldest open group."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from streamrft.producers.admission import headroom
from streamrft.producers.admission_log import AdmissionLog
from tests_helpers import wait_for


def test_concurrent_openings_get_exactly_the_room_and_others_see_them(stack, namespace):
    gateway = AdmissionLog(stack.kafka, namespace, "gateway-a").start()
    other = AdmissionLog(stack.kafka, namespace, "explorer-b").start()
    try:
        wait_for(gateway.caught_up.is_set, 30, "the gateway's ledger read back")
        wait_for(other.caught_up.is_set, 30, "the other ledger read back")
        bound = 5  # all processes together: at most 5 groups generated
        room = lambda generated, dropped, oldest: bound - generated  # noqa: E731
        start = threading.Barrier(12)

        def open_one(i: int) -> bool:
            start.wait()
            return gateway.open_group(version=i % 3, room=room)

        with ThreadPoolExecutor(12) as pool:
            granted = list(pool.map(open_one, range(12)))
        assert sum(granted) == bound
        assert gateway.in_flight == bound
        assert gateway.in_flight_version == min(i % 3 for i, ok in enumerate(granted) if ok)  # the oldest open
        # the other process counts the gateway's open groups
        wait_for(lambda: other.counts()[0] == bound, 30, "the open groups counted")
        assert gateway.open_group(version=0, room=room) is False  # full
        opened = [i % 3 for i, ok in enumerate(granted) if ok]
        gateway.close_group(version=opened[0], published=True)
        gateway.close_group(version=opened[1], published=False)
        assert (gateway.produced, gateway.in_flight) == (1, bound - 2)
        wait_for(lambda: other.counts()[0] == bound - 1, 30, "1 produced + 3 in flight")
        assert gateway.open_group(version=2, room=room) is True
    finally:
        gateway.stop()
        other.stop()


def test_a_process_s_own_slow_group_bounds_what_it_opens_next(stack, namespace):
    log = AdmissionLog(stack.kafka, namespace, "explorer-slow").start()
    try:
        wait_for(log.caught_up.is_set, 30, "the ledger read back")
        oldest_seen = []

        def at(version: int):  # max_staleness 1, 2 groups a version: weights v allow (v + 2) x 2 generated
            room = partial(headroom, version, version, 1, 2)
            return lambda generated, dropped, oldest: (oldest_seen.append(oldest), room(generated, dropped, oldest))[1]

        assert [log.open_group(version=0, room=at(0)) for _ in range(4)] == [True] * 4  # v0's bound: 4
        assert oldest_seen == [None, 0, 0, 0]  # each decision after the first saw the open v0 groups
        log.close_group(version=0, published=True)
        log.close_group(version=0, published=True)
        # the engine now holds v3 (bound 10), but two v0 groups are still open: groups started now would
        # overtake them and they would reach the trainer stale, so the bound stays v0's: 2 produced +
        # 2 open leave none. Counting other processes' open groups alone granted 6 here.
        assert log.open_group(version=3, room=at(3)) is False
        assert oldest_seen[-1] == 0
        log.close_group(version=0, published=True)
        log.close_group(version=0, published=True)
        assert log.open_group(version=3, room=at(3)) is True  # none open: v3's bound, 4 produced
        assert oldest_seen[-1] is None
    finally:
        log.stop()
