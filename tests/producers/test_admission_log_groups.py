"""`AdmissionLog.open_group` on the real stack: concurrent openings share reservation records and
are granted in order exactly as far as the room goes; another process's ledger sees the gateway's
open groups; closing a group moves it from in flight to produced."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

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
