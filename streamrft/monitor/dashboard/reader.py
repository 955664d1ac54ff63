"""Follows one run's topics from `earliest` into a `RunState`, in two background threads.

The record thread assigns every partition of every `<ns>.*` topic from its start (no consumer
group: a dashboard commits nothing and disturbs no role), decodes metrics, experiences, dead
letters and weight announcements, and counts the offsets of the rest (rollouts, tasks, admission)
for the lag figures; new topics (a gateway's new team) are picked up by a rescan. The lag thread
reads the run's consumer groups' committed offsets. Lag is (next offset seen here) - committed,
never the broker's end offsets: the embedded broker reports wrong ones.
"""
from __future__ import annotations

import logging
import threading
import time

from confluent_kafka import OFFSET_BEGINNING, ConsumerGroupTopicPartitions, KafkaException, TopicPartition

from streamrft.config import KafkaConfig
from streamrft.infra.kafka import make_admin, make_consumer
from streamrft.monitor.dashboard.state import RunState
from streamrft.schemas import DeadLetter, DecodeError, ExperienceGroup, Metric, WeightVersion, decode

log = logging.getLogger(__name__)

DECODED = {"metrics": Metric, "experiences": ExperienceGroup, "dlq": DeadLetter, "weights": WeightVersion}


class RunReader:
    def __init__(self, kafka: KafkaConfig, state: RunState, rescan_s: float = 5.0, lag_every_s: float = 3.0):
        self.kafka, self.state, self.ns = kafka, state, state.namespace
        self.rescan_s, self.lag_every_s = rescan_s, lag_every_s
        self.stop_event = threading.Event()
        self.assigned: set[tuple[str, int]] = set()
        self.bad_records = 0  # records that did not decode (a dead letter's business, not ours)
        self.threads: list[threading.Thread] = []

    def start(self) -> "RunReader":
        for name, target in (("dashboard-records", self._records), ("dashboard-lag", self._lag)):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self.threads.append(t)
        return self

    def stop(self) -> None:
        self.stop_event.set()
        for t in self.threads:
            t.join(timeout=10)

    # ---- records ---------------------------------------------------------------------------------
    def _new_partitions(self, consumer) -> list[TopicPartition]:
        topics = consumer.list_topics(timeout=3).topics  # short: a broker away must not hold up stop()
        # from the start, or after a restart of this thread from where it had got to
        fresh = [TopicPartition(name, p, self.state.seen.get((name, p), OFFSET_BEGINNING))
                 for name, meta in sorted(topics.items())
                 if name.startswith(self.ns + ".") for p in meta.partitions
                 if (name, p) not in self.assigned]
        self.assigned.update((tp.topic, tp.partition) for tp in fresh)
        return fresh

    def _records(self) -> None:
        while not self.stop_event.is_set():
            try:
                self._follow()
            except Exception:  # a fatal client error: a new consumer goes on from the offsets seen
                log.exception("dashboard: reading the run's topics failed; starting again in 2 s")
                self.assigned.clear()
                self.stop_event.wait(2.0)

    def _follow(self) -> None:
        consumer = make_consumer(self.kafka, None, **{"client.id": f"dashboard-{self.ns}"})
        next_scan = 0.0
        try:
            while not self.stop_event.is_set():
                if time.monotonic() >= next_scan:
                    next_scan = time.monotonic() + self.rescan_s
                    try:
                        fresh = self._new_partitions(consumer)
                        if fresh:
                            consumer.incremental_assign(fresh)
                    except KafkaException as e:  # broker away: keep what is assigned, look again later
                        log.warning("dashboard: listing topics failed: %s", e)
                msgs = consumer.consume(500, timeout=0.5)
                if msgs:
                    self.apply(msgs)
        finally:
            consumer.close()

    def apply(self, msgs) -> None:
        """Decode outside the lock, then fold everything into the state at once."""
        ready = []
        for m in msgs:
            if m.error() is not None:
                if m.error().fatal():
                    raise KafkaException(m.error())
                continue
            role = m.topic()[len(self.ns) + 1:]
            record = None
            if role in DECODED:
                try:
                    record = decode(m.value(), DECODED[role])
                except DecodeError:
                    self.bad_records += 1
            ready.append((m.topic(), m.partition(), m.offset(), role, record))
        with self.state.lock:
            for topic, partition, offset, role, record in ready:
                self.state.on_offset(topic, partition, offset)
                if record is None:
                    continue
                if role == "metrics":
                    self.state.on_metric(record)
                elif role == "experiences":
                    self.state.on_experience(record, topic, partition, offset)
                elif role == "dlq":
                    self.state.on_dead_letter(record, offset)
                else:
                    self.state.on_weights(record)
            self.state.revision += 1

    # ---- committed offsets -------------------------------------------------------------------------
    def _lag(self) -> None:
        admin = make_admin(self.kafka)
        while not self.stop_event.wait(self.lag_every_s):
            try:
                committed = committed_offsets(admin, self.ns)
            except Exception as e:  # the broker restarting must not end the dashboard
                log.warning("dashboard: reading committed offsets failed: %s", e)
                continue
            with self.state.lock:
                self.state.on_committed(committed)


def committed_offsets(admin, namespace: str) -> dict[str, dict[tuple[str, int], int]]:
    """group -> (topic, partition) -> committed offset, for the run's groups (`<ns>.*`)."""
    groups = sorted(g.group_id for g in admin.list_consumer_groups(request_timeout=10).result().valid
                    if g.group_id.startswith(namespace + "."))
    out: dict[str, dict[tuple[str, int], int]] = {}
    for g in groups:
        res = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(g)], request_timeout=10)
        offsets = {(tp.topic, tp.partition): tp.offset for tp in res[g].result().topic_partitions or []
                   if tp.offset >= 0}
        if offsets:
            out[g] = offsets
    return out


class GroupFetcher:
    """Reads experience groups back from their topic by offset: the viewer's pages older than the
    groups the state keeps whole. One consumer without a group (it commits nothing), used by one
    request at a time; offsets of a partition less than `gap` apart are read in one pass."""

    def __init__(self, kafka: KafkaConfig, gap: int = 64):
        self.kafka, self.gap = kafka, gap
        self.lock = threading.Lock()
        self.consumer = None

    def fetch(self, where: list[tuple[str, int, int]], timeout: float = 10.0) -> dict[tuple[str, int, int], ExperienceGroup]:
        """(topic, partition, offset) -> the group there; one that cannot be read or decoded is left out."""
        by_partition: dict[tuple[str, int], list[int]] = {}
        for topic, partition, offset in where:
            by_partition.setdefault((topic, partition), []).append(offset)
        out: dict[tuple[str, int, int], ExperienceGroup] = {}
        deadline = time.monotonic() + timeout
        with self.lock:
            if self.consumer is None:
                self.consumer = make_consumer(self.kafka, None, **{"client.id": "dashboard-viewer",
                                                                   "fetch.wait.max.ms": 10})
            for (topic, partition), offsets in sorted(by_partition.items()):
                for run in _runs(sorted(set(offsets)), self.gap):
                    self._read(topic, partition, run, out, deadline)
        return out

    def _read(self, topic: str, partition: int, run: list[int], out: dict, deadline: float) -> None:
        self.consumer.assign([TopicPartition(topic, partition, run[0])])
        want = set(run)
        while want and time.monotonic() < deadline:
            for m in self.consumer.consume(min(len(run), 500), timeout=0.5):
                if m.error() is not None or m.topic() != topic or m.partition() != partition:
                    continue
                if m.offset() in want:
                    want.discard(m.offset())
                    try:
                        out[(topic, partition, m.offset())] = decode(m.value(), ExperienceGroup)
                    except DecodeError as e:
                        log.warning("dashboard: %s[%d]@%d does not decode: %s", topic, partition, m.offset(), e)
                if m.offset() >= run[-1]:
                    return

    def close(self) -> None:
        with self.lock:
            if self.consumer is not None:
                self.consumer.close()
                self.consumer = None


def _runs(offsets: list[int], gap: int) -> list[list[int]]:
    """Sorted offsets cut where two are `gap` or more apart."""
    runs: list[list[int]] = []
    for o in offsets:
        if runs and o - runs[-1][-1] < gap:
            runs[-1].append(o)
        else:
            runs.append([o])
    return runs
