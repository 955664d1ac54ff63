"""An explorer's side of `<ns>.admission`: its own ledger out, everyone's counts in, kept by a thread.

The topic has one partition and is read whole from offset 0 (never from `latest`: the embedded
broker's end offsets are wrong). The thread first publishes this process's ledger (0 produced)
and counts the topic as read once that record comes back: everything published before it has
been folded into the view by then, so a restarted or newly joined explorer never decides on a
partial count. After that it follows the topic and republishes the ledger whenever the explorer
reports a change, and every `REFRESH_S` while a batch is in flight (the lease in `admission.py`).
"""
from __future__ import annotations

import logging
import threading
import time

from confluent_kafka import KafkaException, TopicPartition

from streamrft.config import KafkaConfig
from streamrft.infra.kafka import ensure_topics, flush_or_raise, make_consumer, make_producer, run_topics
from streamrft.producers.admission import LEASE_S, REFRESH_S, AdmissionView
from streamrft.schemas import DecodeError, ExplorerLedger, GroupDropped, decode, encode, topic_name

log = logging.getLogger(__name__)


class AdmissionLog:
    def __init__(self, kafka: KafkaConfig, namespace: str, explorer_id: str, lease_s: float = LEASE_S,
                 refresh_s: float = REFRESH_S):
        self.kafka, self.namespace, self.id = kafka, namespace, explorer_id
        self.topic = topic_name(namespace, "admission")
        self.refresh_s = refresh_s
        self.view = AdmissionView(explorer_id, lease_s)
        self.produced = self.in_flight = 0
        self.caught_up = threading.Event()
        self.failed: BaseException | None = None
        self._lock = threading.Lock()
        self._changed = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="admission-log", daemon=True)
        self._producer = None
        self._sent = self._acked = 0  # ledgers published / the newest of them acknowledged

    def start(self) -> "AdmissionLog":
        ensure_topics(self.kafka, {self.topic: run_topics(self.kafka, self.namespace)[self.topic]})
        self._producer = make_producer(self.kafka)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Publish the final ledger (nothing in flight) and wait until the broker has it."""
        self._stop.set()
        self._thread.join(timeout=30)
        if self._producer is not None and self.failed is None:
            with self._lock:
                self.in_flight = 0
            self._publish()
            flush_or_raise(self._producer)

    def counts(self) -> tuple[int, int]:
        """(generated, dropped): groups every explorer generated or is generating, and those of
        them that will never be trained. Raises if the thread stopped."""
        if self.failed is not None:
            raise RuntimeError("the admission log stopped") from self.failed
        with self._lock:
            return (self.view.generated(time.monotonic(), self.produced, self.in_flight), self.view.dropped)

    def begin(self, groups: int) -> None:
        """This explorer starts generating `groups` groups: the others count them from now on."""
        with self._lock:
            self.in_flight = groups
        self._changed.set()

    def end(self, published: int) -> None:
        """The batch is over; `published` of its groups were acknowledged by the broker."""
        with self._lock:
            self.produced += published
            self.in_flight = 0
        self._changed.set()

    def _publish(self) -> None:
        with self._lock:
            ledger = ExplorerLedger(explorer_id=self.id, produced=self.produced, in_flight=self.in_flight)
        self._sent += 1
        seq = self._sent

        def acked(err, msg) -> None:
            self._acked = max(self._acked, seq)

        self._producer.produce(self.topic, key=self.id.encode(), value=encode(ledger), on_delivery=acked)

    def _fold(self, msgs) -> None:
        now = time.monotonic()
        for m in msgs:
            if m.error() is not None:
                if m.error().fatal():
                    raise KafkaException(m.error())
                log.warning("consume error on %s: %s", self.topic, m.error())
                continue
            try:
                record = decode(m.value())
            except DecodeError as e:
                log.warning("bad record on %s offset %d: %s", self.topic, m.offset(), e)
                continue
            if not isinstance(record, (ExplorerLedger, GroupDropped)):
                log.warning("unexpected %s on %s offset %d", record.kind, self.topic, m.offset())
                continue
            if isinstance(record, ExplorerLedger) and record.explorer_id == self.id:
                self.caught_up.set()  # our own first record came back: all before it is folded
            with self._lock:
                self.view.apply(record, now)

    def _run(self) -> None:
        consumer = make_consumer(self.kafka, None)
        consumer.assign([TopicPartition(self.topic, 0, 0)])
        try:
            self._publish()
            last = time.monotonic()
            while not self._stop.is_set():
                self._fold(consumer.consume(500, timeout=0.1))
                now = time.monotonic()
                # a change goes out at once; the ledger is republished now and then until it is
                # read back (catch-up) and acknowledged (a broker restart), and while a batch is
                # in flight (the lease)
                pending = self.in_flight or not self.caught_up.is_set() or self._acked < self._sent
                due = pending and now - last > self.refresh_s
                if self._changed.is_set() or due:
                    self._changed.clear()
                    self._publish()
                    last = now
                self._producer.poll(0)
        except BaseException as e:
            self.failed = e
            log.error("admission log stopped: %s: %s", type(e).__name__, e)
            raise
        finally:
            consumer.close()
