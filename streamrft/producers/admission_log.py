"""An explorer's side of `<ns>.admission`: its own ledger out, everyone's counts in.

The topic has one partition and is read from offset 0, or from the fold's newest snapshot on
(`fold_snapshot.py`), never from `latest` (the embedded broker's end offsets are wrong). A thread folds it into an `AdmissionView`. The explorer's first
record is its ledger with nothing produced; the counts are read once that record comes back, so a
restarted or newly joined explorer never decides on a partial count.

Reservations are ordered by the topic: `reserve` publishes the ledger with the groups about to be
generated, waits until the thread reads that record back, and keeps only as many as the records
before it leave room for (the rest is released at once). Every explorer reads the same order, so
two explorers deciding at the same moment never both take the last group of headroom. While a
batch is in flight the thread republishes the ledger every `REFRESH_S` (the lease in `admission.py`).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from confluent_kafka import TopicPartition

from streamrft.config import KafkaConfig
from streamrft.infra.kafka import decoded, ensure_topics, flush_or_raise, make_consumer, make_producer, run_topics
from streamrft.infra.offset_gaps import OffsetGaps, assign_guarded, take_contiguous
from streamrft.producers.admission import LEASE_S, REFRESH_S, AdmissionView, Ledger
from streamrft.producers.fold_snapshot import FoldSnapshots
from streamrft.producers.once import OnceWindow
from streamrft.schemas import ExplorerLedger, GroupDropped, encode, topic_name

log = logging.getLogger(__name__)

Counts = tuple[int, int, "int | None"]  # (generated, dropped, oldest version in flight)
FETCH_WAIT_MS = 100
SNAPSHOT = "admission"


class _Ticket:
    """One `open_group` request: decided by whichever caller takes it into a reservation."""

    def __init__(self, version: int):
        self.version, self.ok, self.decided = version, False, False


class AdmissionLog:
    def __init__(self, kafka: KafkaConfig, namespace: str, explorer_id: str, lease_s: float = LEASE_S,
                 refresh_s: float = REFRESH_S, snapshots: FoldSnapshots | None = None):
        self.kafka, self.namespace, self.id, self.snapshots = kafka, namespace, explorer_id, snapshots
        # every ledger read, this process's own included (a snapshot serves other processes), and
        # where the fold is: a snapshot is the state after the records before `_next`
        self._ledgers: dict[str, list[int]] = {}
        self._next = 0
        self.folded = 0  # records read and folded by this process
        self.topic = topic_name(namespace, "admission")
        self.refresh_s = refresh_s
        self.view = AdmissionView(explorer_id, lease_s)
        self.produced = self.in_flight = self.in_flight_version = 0
        self.caught_up = threading.Event()
        self.failed: BaseException | None = None
        self._lock = threading.Lock()  # the counts, the view and the producer (two threads publish)
        self._read = threading.Condition(self._lock)  # notified when one of our records is read back
        self._before: dict[int, Counts] = {}  # offset of our reservation -> the counts of what precedes it
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="admission-log", daemon=True)
        self._producer = None
        self._sent = self._acked = 0  # ledgers published / the newest of them acknowledged
        self._last_publish = 0.0
        self._open: dict[int, int] = {}  # open_group: weight version -> groups open with it
        self._opening = threading.Lock()
        self._waiting: list[_Ticket] = []  # open_group requests not decided yet

    def start(self) -> "AdmissionLog":
        ensure_topics(self.kafka, {self.topic: run_topics(self.kafka, self.namespace)[self.topic]})
        self._producer = make_producer(self.kafka)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Publish the final ledger (nothing in flight) and wait until the broker has it."""
        self._stop.set()
        if self._thread.ident is not None:  # started
            self._thread.join(timeout=30)
        if self._producer is not None:
            try:
                if self.failed is None:
                    with self._lock:
                        self.in_flight = 0
                        self._publish()
                    flush_or_raise(self._producer)
            finally:
                self._producer.close()
                self._producer = None  # stopped: a second stop() does nothing

    def counts(self) -> Counts:
        """(generated, dropped, oldest in flight): groups every explorer generated or is generating,
        those of them that will never be trained, and the oldest weight version another explorer
        is generating with now (`admission.headroom`). Raises if the thread stopped."""
        self._check()
        with self._lock:
            return self._counts(self.produced)

    def reserve(self, groups: int, version: int, room: Callable[[int, int, "int | None"], int],
                timeout: float = 30.0) -> int:
        """Reserve `groups` groups made with weights `version`; returns how many of them to generate.

        `room(generated, dropped, oldest_in_flight)` is the headroom that the records before the
        reservation leave (`admission.headroom`); what it does not cover is released at once. On
        a broker that does not answer within `timeout`, nothing is granted.
        """
        self._check()
        offset: list[int] = []
        with self._lock:
            self.in_flight, self.in_flight_version = groups, version
            self._publish(on_acked=lambda msg: offset.append(msg.offset()))
        self._producer_flush(timeout)
        granted = 0
        with self._read:
            if offset and self._read.wait_for(lambda: offset[0] in self._before or self.failed is not None,
                                              timeout):
                granted = max(0, min(groups, room(*self._before.pop(offset[0]))))
            if granted != groups:
                self.in_flight = granted
                self._publish()
        self._check()
        return granted

    def end(self, published: int) -> None:
        """The batch is over; `published` of its groups were acknowledged by the broker."""
        with self._lock:
            self.produced += published
            self.in_flight = 0
            self._publish()

    # ---- one group at a time, many open at once (the gateway) ----------------------------------
    def open_group(self, version: int, room: Callable[[int, int, "int | None"], int], timeout: float = 30.0) -> bool:
        """Start one more group made with weights `version` next to the groups this process has open
        (`reserve`/`end` are for a batch at a time, this for a server's concurrent groups). True when
        the records before the reservation leave room for all of them, the new one included; else
        it is released at once. The ledger's `in_flight_version` is the oldest open group's.

        Concurrent callers share decisions: whoever decides takes every request waiting at that
        moment into one reservation record (a round trip to the broker each, ~30 ms here), granting
        them in arrival order as far as the room goes."""
        self._check()
        ticket = _Ticket(version)
        with self._lock:
            self._waiting.append(ticket)
        with self._opening:  # one decision at a time: each sees the open groups before it
            if not ticket.decided:
                self._decide(room, timeout)
        self._check()
        return ticket.ok

    def _decide(self, room: Callable[[int, int, "int | None"], int], timeout: float) -> None:  # _opening held
        offset: list[int] = []
        with self._lock:
            batch, self._waiting = self._waiting, []
            before = self.in_flight
            # this process's own oldest open group counts as another's would (`admission.headroom`):
            # groups started now would overtake it, and it would reach the trainer stale
            own_oldest = min(self._open, default=None)
            for t in batch:
                self._open[t.version] = self._open.get(t.version, 0) + 1
            self._set_in_flight()
            self._publish(on_acked=lambda msg: offset.append(msg.offset()))
        self._producer_flush(timeout)
        granted = 0
        with self._read:
            try:
                if offset and self._read.wait_for(lambda: offset[0] in self._before or self.failed is not None,
                                                  timeout):
                    generated, dropped, oldest = self._before.pop(offset[0])
                    if own_oldest is not None:
                        oldest = own_oldest if oldest is None else min(oldest, own_oldest)
                    granted = max(0, min(len(batch), room(generated, dropped, oldest) - before))
            finally:  # whatever happened, every request of the batch is decided and what was refused released
                self._settle(batch, granted)

    def _settle(self, batch: list[_Ticket], granted: int) -> None:  # lock held
        for i, t in enumerate(batch):
            t.ok, t.decided = i < granted, True
            if not t.ok:
                self._close(t.version)
        if granted < len(batch):
            self._publish()

    def close_group(self, version: int, published: bool) -> None:
        """An open group (opened with `version`) is over: acknowledged by the broker, or dropped."""
        with self._lock:
            self.produced += int(published)
            self._close(version)
            self._publish()

    def _close(self, version: int) -> None:  # lock held
        left = self._open.get(version, 0) - 1
        if left > 0:
            self._open[version] = left
        else:
            self._open.pop(version, None)
        self._set_in_flight()

    def _set_in_flight(self) -> None:  # lock held
        self.in_flight = sum(self._open.values())
        self.in_flight_version = min(self._open, default=0)

    # ---- internals (the lock held where noted) -------------------------------------------------
    def _check(self) -> None:
        if self.failed is not None:
            raise RuntimeError("the admission log stopped") from self.failed

    def _counts(self, produced: int) -> Counts:  # lock held
        now = time.monotonic()
        return self.view.generated(now, produced, 0), self.view.dropped, self.view.oldest_in_flight(now)

    def _publish(self, on_acked: Callable | None = None) -> None:  # lock held
        ledger = ExplorerLedger(explorer_id=self.id, produced=self.produced, in_flight=self.in_flight,
                                in_flight_version=self.in_flight_version)
        self._sent += 1
        seq = self._sent

        def acked(err, msg) -> None:
            self._acked = max(self._acked, seq)
            if on_acked is not None:
                on_acked(msg)

        self._producer.produce(self.topic, key=self.id.encode(), value=encode(ledger), on_delivery=acked)
        self._last_publish = time.monotonic()

    def _producer_flush(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self._acked < self._sent and time.monotonic() < deadline and self.failed is None:
            with self._lock:
                self._producer.flush(0.05)

    def _fold(self, msgs) -> None:
        for m, record in decoded(msgs, self.topic):
            if not isinstance(record, (ExplorerLedger, GroupDropped)):
                log.warning("unexpected %s on %s offset %d", record.kind, self.topic, m.offset())
                continue
            with self._read:
                if isinstance(record, ExplorerLedger):
                    old = self._ledgers.get(record.explorer_id)
                    self._ledgers[record.explorer_id] = [max(record.produced, old[0]) if old else record.produced,
                                                         record.in_flight, record.in_flight_version]
                if isinstance(record, ExplorerLedger) and record.explorer_id == self.id:
                    self.caught_up.set()  # our own record came back: everything before it is folded
                    if record.in_flight:  # a reservation: what precedes it decides how much it keeps
                        self._before[m.offset()] = self._counts(record.produced)
                        while len(self._before) > 64:  # never claimed: a reservation that timed out
                            del self._before[min(self._before)]
                    self._read.notify_all()
                else:
                    self.view.apply(record, time.monotonic())

    def _restore(self) -> None:
        """Start from the fold's newest snapshot, if there is one (`fold_snapshot.py`)."""
        snap = self.snapshots.load(SNAPSHOT) if self.snapshots is not None else None
        if snap is None or set(snap[0]) != {0}:
            return
        now = time.monotonic()
        with self._lock:
            self._next = snap[0][0]
            self._ledgers = {k: list(v) for k, v in snap[1]["ledgers"].items()}
            for explorer_id, (produced, in_flight, version) in self._ledgers.items():
                if explorer_id != self.id:
                    self.view.ledgers[explorer_id] = Ledger(produced, in_flight, version, now)
            self.view.dropped_ids = OnceWindow.from_state(snap[1]["dropped"])

    def _advance(self, msgs) -> None:
        """Past the records just folded; now and then, a snapshot of the fold there."""
        taken = [m.offset() for m in msgs if m.error() is None]
        if not taken:
            return
        with self._lock:
            self._next = max(self._next, max(taken) + 1)
            self.folded += len(taken)
            if self.snapshots is None or not self.snapshots.due(SNAPSHOT, {0: self._next}):
                return
            nxt, state = {0: self._next}, self.state()
        self.snapshots.save(SNAPSHOT, nxt, state)

    def state(self) -> dict:  # lock held
        """The fold so far: every process's ledger and the dropped groups' ids."""
        return {"ledgers": {k: list(v) for k, v in self._ledgers.items()}, "dropped": self.view.dropped_ids.state()}

    def _run(self) -> None:
        # a reservation waits for its record to come back. Measured on the embedded broker: 157 ms
        # with librdkafka's default 500 ms fetch wait, 57 ms with 100, 16 ms with 20; but at 20
        # every explorer's idle fetches kept the S3 server under it busy (73% of a core in the
        # CPU demo, which ran slower for it)
        consumer = make_consumer(self.kafka, None, **{"fetch.wait.max.ms": FETCH_WAIT_MS})
        # never past a record the broker lists late: every explorer must fold the same order
        gaps = OffsetGaps(self.kafka.gap_wait_s, name="admission-log")
        try:
            self._restore()
            assign_guarded(consumer, gaps, [TopicPartition(self.topic, 0, self._next)])
            with self._lock:
                self._publish()
            while not self._stop.is_set():
                # consume() waits out its timeout
                msgs = take_contiguous(consumer, gaps, consumer.consume(500, timeout=0.01))
                self._fold(msgs)
                self._advance(msgs)
                with self._lock:
                    # republished now and then until read back (catch-up) and acknowledged (a
                    # broker restart), and while a batch is in flight (the lease)
                    pending = self.in_flight or not self.caught_up.is_set() or self._acked < self._sent
                    if pending and time.monotonic() - self._last_publish > self.refresh_s:
                        self._publish()
                    self._producer.poll(0)
        except BaseException as e:
            self.failed = e
            log.error("admission log stopped: %s: %s", type(e).__name__, e)
            with self._read:
                self._read.notify_all()
            raise
        finally:
            consumer.close()
