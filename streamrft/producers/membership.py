"""Which explorers are present, through a Kafka consumer group: Kafka's own tool for "who is here".

Every explorer joins group `<ns>.explorer-members` on the topic `<ns>.explorer-slots`, whose
partitions are the run's *slots* (64 by default; nothing is ever written to it). The partitions
the group assigns to an explorer are its slots: it takes the file tasks of those slots and that
share of the admission headroom (`admission.py`). An explorer that joins makes the others give up slots; one that
leaves (or is killed: after `kafka.session_timeout_ms`) has its slots moved to the others.
A background thread polls, so the group keeps seeing the explorer while it generates.
"""
from __future__ import annotations

import logging
import threading

from confluent_kafka.admin import NewTopic

from streamrft.config import KafkaConfig
from streamrft.infra.kafka import ensure_topics, make_consumer

log = logging.getLogger(__name__)

NUM_SLOTS = 64


def slots_topic(namespace: str) -> str:
    return f"{namespace}.explorer-slots"


def members_group(namespace: str) -> str:
    return f"{namespace}.explorer-members"


class Membership:
    """This explorer's current slots (`slots`, a frozenset) out of `num_slots`, kept by a thread.

    Eager rebalancing (the range assignor): while a rebalance runs, the explorer keeps working on
    its old slots and switches when the new assignment arrives, so a join or a leave pauses no
    one; the overlap is at most the batches in flight at the switch. Until its first assignment,
    or when there are more explorers than slots, an explorer holds no slot.
    """

    def __init__(self, kafka: KafkaConfig, namespace: str, member_name: str, num_slots: int = NUM_SLOTS):
        self.kafka, self.topic, self.group, self.name = kafka, slots_topic(namespace), members_group(namespace), member_name
        self.num_slots = num_slots
        self._slots: frozenset[int] = frozenset()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="explorer-membership", daemon=True)
        self._consumer = None

    @property
    def slots(self) -> frozenset[int]:
        with self._lock:
            return self._slots

    def start(self) -> "Membership":
        ensure_topics(self.kafka, {self.topic: NewTopic(self.topic, num_partitions=self.num_slots,
                                                        replication_factor=self.kafka.replication_factor)})
        # "partition.assignment.strategy": eager, whatever kafka.extra says: _on_assign replaces the set
        self._consumer = make_consumer(self.kafka, self.group, **{"client.id": self.name,
                                                                  "partition.assignment.strategy": "range"})
        meta = self._consumer.list_topics(self.topic, timeout=10).topics[self.topic]
        # a topic made earlier with another partition count wins: every member must count the same slots
        self.num_slots = len(meta.partitions)
        self._consumer.subscribe([self.topic], on_assign=self._on_assign, on_lost=self._on_lost)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Leave the group now (the others rebalance at once instead of after the session timeout)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def _set(self, slots: frozenset[int]) -> None:
        with self._lock:
            changed = slots != self._slots
            self._slots = slots
        if changed:
            log.info("%s: %d of %d slots", self.name, len(slots), self.num_slots)

    def _on_assign(self, consumer, partitions) -> None:
        # nothing is ever read: paused partitions cost no fetches, heartbeats go on
        consumer.assign(partitions)
        if partitions:
            consumer.pause(partitions)
        self._set(frozenset(p.partition for p in partitions))

    def _on_lost(self, consumer, partitions) -> None:
        # the group already gave these slots to others (our session expired): hold none until we rejoin
        self._set(frozenset())

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                msg = self._consumer.poll(0.5)  # serves the rebalance callbacks
                if msg is not None and msg.error() is not None:
                    log.warning("%s: %s", self.group, msg.error())
        finally:
            self._consumer.close()  # LeaveGroup
            self._set(frozenset())
