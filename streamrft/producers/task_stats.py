"""An explorer's reader of `<ns>.task-stats`: every scored group's episode rewards, into `TaskStats`.

Stream ops publish one `TaskOutcome` per scored group, the zero-variance groups they drop
included (all solved or all failed: exactly what the difficulty selector needs), keyed by group_id.
A thread reads the topic from offset 0, or from the newest snapshot of the fold
(`fold_snapshot.py`) on (never from `latest`: the embedded broker's end offsets are wrong), so
every explorer folds the same records and a restarted one rebuilds its stats from the log. Tansu may not compact; `TaskStats` counts each group_id once either way.
"""
from __future__ import annotations

import logging
import threading

from confluent_kafka import TopicPartition

from streamrft.config import KafkaConfig
from streamrft.infra.kafka import decoded, ensure_topics, make_consumer, run_topics
from streamrft.infra.offset_gaps import OffsetGaps, assign_guarded, take_contiguous
from streamrft.producers.fold_snapshot import FoldSnapshots
from streamrft.producers.task_selection import TaskStats
from streamrft.schemas import TaskOutcome, topic_name

log = logging.getLogger(__name__)
SNAPSHOT = "task-stats"


class TaskStatsReader:
    """Folds `<ns>.task-stats` into `self.stats` in a background thread, from `start` to `stop`."""

    def __init__(self, kafka: KafkaConfig, namespace: str, stats: TaskStats, snapshots: FoldSnapshots | None = None):
        self.kafka, self.namespace, self.stats, self.snapshots = kafka, namespace, stats, snapshots
        self.folded = 0  # records read and folded by this process (a snapshot spares the ones before it)
        self.topic = topic_name(namespace, "task-stats")
        self.failed: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="task-stats", daemon=True)

    def start(self) -> "TaskStatsReader":
        ensure_topics(self.kafka, {self.topic: run_topics(self.kafka, self.namespace)[self.topic]})
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def _run(self) -> None:
        consumer = make_consumer(self.kafka, None)
        try:
            meta = consumer.list_topics(self.topic, timeout=10).topics[self.topic]
            nxt = {p: 0 for p in sorted(meta.partitions)}
            snap = self.snapshots.load(SNAPSHOT) if self.snapshots is not None else None
            if snap is not None and set(snap[0]) == set(nxt):
                nxt = dict(snap[0])
                self.stats.restore(snap[1])
            gaps = OffsetGaps(self.kafka.gap_wait_s, name="task-stats")  # records the broker lists late
            assign_guarded(consumer, gaps, [TopicPartition(self.topic, p, o) for p, o in nxt.items()])
            while not self._stop.is_set():
                msgs = take_contiguous(consumer, gaps, consumer.consume(1000, timeout=0.5))
                for m, outcome in decoded(msgs, self.topic, TaskOutcome):
                    self.stats.add(outcome)
                for m in msgs:
                    if m.error() is None:
                        nxt[m.partition()] = max(nxt[m.partition()], m.offset() + 1)
                        self.folded += 1
                if self.snapshots is not None and self.snapshots.due(SNAPSHOT, nxt):
                    self.snapshots.save(SNAPSHOT, dict(nxt), self.stats.state())
        except BaseException as e:  # selection goes on with what was read; the explorer reports it
            self.failed = e
            log.error("task-stats reader stopped: %s: %s", type(e).__name__, e)
        finally:
            consumer.close()
