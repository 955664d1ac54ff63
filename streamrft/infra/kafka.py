"""Kafka client factories, idempotent topic admin and end offsets that are right on any broker.

Every role except stream ops uses confluent-kafka (librdkafka). Measured here with
`benchmarks/kafka_clients.py` (20k x 2 KB, acks=all, Tansu on S3): aiokafka produces faster
(1.5-2.2x, it cannot be idempotent there) and consumes a little slower (0.8-0.9x). We still take
confluent-kafka because it can be idempotent on a real cluster (`KafkaConfig.idempotence`;
aiokafka's idempotent producer fails InitProducerId on the embedded broker, and librdkafka's loses
acked records there when the broker is killed, so it is off by default); its API is synchronous,
as explorers and the trainer are; and it speaks SASL/SCRAM to a real cluster. faust brings its
own aiokafka clients, configured from the same `KafkaConfig` in `stream_ops/app.py`.

`make_producer` returns a `CheckedProducer`: nothing counts as sent until its delivery report
says the broker acknowledged it. `flush_or_raise` retries what failed and raises otherwise.
"""
from __future__ import annotations

import logging
import time
import weakref
from dataclasses import dataclass
from typing import Callable, Iterator

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from streamrft.config import KafkaConfig
from streamrft.schemas import DecodeError, decode, topic_name

log = logging.getLogger(__name__)

def client_conf(cfg: KafkaConfig) -> dict:
    # log_level 4: warnings and errors only (librdkafka's info lines are noise in role logs)
    conf = {"bootstrap.servers": cfg.bootstrap, "security.protocol": cfg.security_protocol, "log_level": 4,
            "socket.timeout.ms": cfg.socket_timeout_ms}
    if cfg.sasl_mechanism:
        conf.update({"sasl.mechanism": cfg.sasl_mechanism, "sasl.username": cfg.username or "",
                     "sasl.password": cfg.password or ""})
    conf.update(cfg.extra)
    return conf


def make_producer(cfg: KafkaConfig, **overrides) -> "CheckedProducer":
    """acks=all behind a wrapper that checks every delivery report; idempotent only where
    `cfg.idempotence` says so (see `KafkaConfig.idempotence`: Tansu loses acked records with it)."""
    conf = {**client_conf(cfg), "acks": "all", "linger.ms": 5,
            "message.max.bytes": 16 * 1024 * 1024, "compression.type": "none"}
    if cfg.idempotence:
        conf["enable.idempotence"] = True
    else:  # at-least-once, in order: a retry never overtakes the next batch
        conf.update({"enable.idempotence": False, "max.in.flight.requests.per.connection": 1})
    conf.update(overrides)
    return CheckedProducer(conf)


class DeliveryError(KafkaException):
    """Records the broker did not acknowledge (after retries): the role must fail loudly."""


# delivery errors worth sending again: the broker or the network was away, not the record bad
_RESEND = {KafkaError._MSG_TIMED_OUT, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT,
           KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT, KafkaError.NOT_ENOUGH_REPLICAS,
           KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND, KafkaError.REQUEST_TIMED_OUT, KafkaError.NETWORK_EXCEPTION,
           KafkaError.UNKNOWN}  # Tansu answers UNKNOWN while its S3 store is away
# errors after which this producer can deliver nothing more (measured on Tansu after an S3
# restart: UNKNOWN, then PRODUCER_FENCED for every later record, with no error_cb at all)
_REPLACE = {KafkaError.PRODUCER_FENCED, KafkaError._FENCED, KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER,
            KafkaError.UNKNOWN_PRODUCER_ID, KafkaError.INVALID_PRODUCER_EPOCH, KafkaError._FATAL}


def _resendable(err: KafkaError) -> bool:
    return err.retriable() or err.code() in _RESEND


class CheckedProducer:
    """A confluent-kafka producer that never reports a record as sent without the broker's ack.

    Every produced record is kept until its delivery report succeeds. `flush` serves the reports
    and, until its deadline, sends again what failed for a transient reason (broker restart,
    timeout). A fatal error (the broker fenced an idempotent producer, as Tansu does after its S3
    store restarts) makes the broker refuse everything this producer sends from then on: the
    producer is then replaced by a new one and every unacknowledged record is sent again.
    Re-sending is at-least-once: a record acked just before a failure may arrive twice, which
    every consumer in streamrft tolerates (the trainer dedups by trajectory id). A record
    rejected for itself (too large, not authorised) raises `DeliveryError` at once.
    """

    def __init__(self, conf: dict, factory: Callable[[dict], Producer] = Producer):
        self._conf, self._factory = dict(conf), factory
        self._pending: dict[int, tuple] = {}  # seq -> (topic, key, value, partition, on_delivery)
        self._failed: dict[int, KafkaError] = {}
        self._fatal: KafkaError | None = None
        self._seq = self._gen = 0
        self.resent = 0
        self.replaced = 0
        self._producer = self._new_producer()

    def _new_producer(self) -> Producer:
        self._gen += 1
        gen = self._gen
        # weakly: a callback holding this wrapper would make a cycle through the C producer, freed
        # only by a later garbage collection; meanwhile a dropped producer kept connecting to a
        # broker that may be gone ("Connection refused" in every test session's last seconds)
        ref = weakref.ref(self)

        def on_error(err: KafkaError) -> None:
            this = ref()
            if this is not None and err.fatal() and gen == this._gen:
                this._fatal = err
            log.warning("kafka producer: %s", err)

        return self._factory({**self._conf, "error_cb": on_error})

    def __len__(self) -> int:
        return len(self._pending)

    def close(self) -> None:
        """Close the connections now (idempotent). What the broker has not acknowledged is dropped,
        not sent: `flush_or_raise` first to deliver it. A producer left to the garbage collector
        keeps reconnecting meanwhile, to a broker that may be gone."""
        if self._producer is None:
            return
        producer, self._producer = self._producer, None
        producer.purge()
        producer.close()

    def produce(self, topic: str, value=None, key=None, partition: int | None = None,
                on_delivery: Callable | None = None) -> None:
        """Queue one record; `on_delivery(None, msg)` runs once the broker acknowledged it."""
        self._seq += 1
        self._pending[self._seq] = (topic, key, value, partition, on_delivery)
        self._send(self._seq)
        self._producer.poll(0)

    def _send(self, seq: int) -> None:
        topic, key, value, partition, _ = self._pending[seq]
        gen = self._gen
        extra = {} if partition is None else {"partition": partition}

        def delivered(err, msg) -> None:
            if gen != self._gen:
                return  # a report from a replaced producer: the record was queued again
            if err is not None:
                self._failed[seq] = err
                if err.fatal() or err.code() in _REPLACE:
                    self._fatal = err
                return
            self._failed.pop(seq, None)
            record = self._pending.pop(seq, None)
            if record is not None and record[4] is not None:
                record[4](None, msg)

        while True:
            try:
                self._producer.produce(topic, value=value, key=key, on_delivery=delivered, **extra)
                return
            except BufferError:  # the local queue is full: serve reports, then try again
                self._producer.poll(0.1)
            except KafkaException as e:
                err = e.args[0] if e.args and isinstance(e.args[0], KafkaError) else None
                if err is None or not err.fatal():
                    self._pending.pop(seq, None)
                    raise DeliveryError(f"produce to {topic} refused: {e}") from None
                self._fatal, self._failed[seq] = err, err  # flush replaces the producer
                return

    def poll(self, timeout: float = 0.0) -> int:
        return self._producer.poll(timeout)

    def _replace(self) -> None:
        """Drop a fatally failed producer; send every unacknowledged record through a new one."""
        log.warning("kafka producer failed fatally (%s): replacing it, re-sending %d records",
                    self._fatal, len(self._pending))
        old = self._producer
        self._producer = self._new_producer()  # bumps the generation: old reports are ignored
        try:
            old.purge(in_queue=True, in_flight=True, blocking=False)
        except KafkaException:
            pass
        self._fatal = None
        self._failed.clear()
        self.replaced += 1
        for seq in list(self._pending):
            self._send(seq)
            self.resent += 1

    def flush(self, timeout: float = 30.0) -> int:
        """Deliver everything, re-sending transient failures until `timeout`; returns the number
        of records still unacknowledged. Raises `DeliveryError` for a record rejected for itself."""
        deadline = time.monotonic() + timeout
        while self._pending:
            self._producer.flush(max(0.0, min(0.5, deadline - time.monotonic())))
            self._settle(resend=time.monotonic() < deadline)
            if time.monotonic() >= deadline:
                break
        return len(self._pending)

    def serve(self) -> None:
        """`flush` without waiting, for a publisher that never blocks on the broker: serve the delivery
        reports there are, send again what failed for a transient reason (replacing a fatally failed
        producer), and raise `DeliveryError` for a record rejected for itself."""
        self._producer.poll(0)
        self._settle(resend=True)

    def _settle(self, resend: bool) -> None:
        if self._fatal is not None:
            self._replace()
        for seq, err in list(self._failed.items()):
            if seq not in self._pending:
                self._failed.pop(seq)
            elif not _resendable(err):
                topic = self._pending[seq][0]
                raise DeliveryError(f"record to {topic} rejected by the broker: {err.name()}: {err.str()}")
            elif resend:
                del self._failed[seq]
                self._send(seq)
                self.resent += 1

    def last_errors(self) -> list[str]:
        return sorted({f"{e.name()}: {e.str()}" for e in self._failed.values()})


def make_consumer(cfg: KafkaConfig, group_id: str | None, loop_path: bool = False, **overrides) -> Consumer:
    """Explicit commits only; a new group starts at `earliest` (never `latest`, see DEVELOPERS.md).
    A consumer on the loop's path (`loop_path`: the trainer's, the weights watcher's) fetches with
    `kafka.fetch_wait_ms`, the others with librdkafka's default 500 ms (fewer idle fetches)."""
    conf = {**client_conf(cfg), "group.id": group_id or "streamrft-probe", "enable.auto.commit": False,
            "auto.offset.reset": "earliest", "session.timeout.ms": cfg.session_timeout_ms,
            "heartbeat.interval.ms": cfg.heartbeat_interval_ms, "enable.partition.eof": False,
            "fetch.max.bytes": 64 * 1024 * 1024, "max.partition.fetch.bytes": 16 * 1024 * 1024}
    if loop_path:
        conf["fetch.wait.max.ms"] = cfg.fetch_wait_ms
    conf.update(overrides)
    return Consumer(conf)


def consume_ready(consumer: Consumer, n: int, timeout: float) -> list:
    """Up to `n` records (errors included, as `consume` gives them): waits at most `timeout` for the
    first, then takes what the client holds already. librdkafka's `consume(n, timeout)` waits out
    its whole timeout unless `n` records come, which cost the CPU demo's trainer 0.5 s a step."""
    first = consumer.poll(timeout)
    if first is None:
        return []
    return [first, *consumer.consume(n - 1, timeout=0)] if n > 1 else [first]


def make_admin(cfg: KafkaConfig) -> AdminClient:
    return AdminClient(client_conf(cfg))


def flush_or_raise(producer: CheckedProducer, timeout: float = 60.0) -> None:
    """Block until every record produced so far is acknowledged; `DeliveryError` otherwise.

    Transient failures (a broker or S3 restart under the broker) are retried within `timeout`."""
    left = producer.flush(timeout)
    if left:
        errors = producer.last_errors()
        raise DeliveryError(f"{left} records not acknowledged by the broker after {timeout}s"
                            + (f" (last errors: {'; '.join(errors)})" if errors else ""))


def run_topics(cfg: KafkaConfig, namespace: str, teams: list[str] | tuple[str, ...] = ("default",)) -> dict[str, NewTopic]:
    """The topics of one run: name -> spec (partitions, retention, the weights topic compacted)."""
    keep = {"retention.ms": str(cfg.retention_ms)}
    specs = {
        topic_name(namespace, "tasks"): (cfg.partitions, keep),
        topic_name(namespace, "experiences"): (cfg.partitions, keep),
        topic_name(namespace, "weights"): (1, {"cleanup.policy": "compact"}),
        topic_name(namespace, "metrics"): (1, keep),
        topic_name(namespace, "dlq"): (1, keep),
        # explorers read it whole from the start (one partition: reading back their own first
        # record proves they have read everything before it); compaction keeps the newest ledger
        # of each explorer process and one record per dropped group
        topic_name(namespace, "admission"): (1, {"cleanup.policy": "compact"}),
        # every explorer folds it whole from offset 0 into per-task pass rates (task selection);
        # keyed by group_id, so compaction drops only redelivered copies of a group's outcome
        topic_name(namespace, "task-stats"): (1, {"cleanup.policy": "compact"}),
        # groups waiting for their ratings (a `feedback` reward term): the feedback join folds it
        # whole from offset 0 on start; a joined group's tombstone lets compaction drop it
        topic_name(namespace, "parked"): (cfg.partitions, {"cleanup.policy": "compact"}),
    }
    for team in teams:
        specs[topic_name(namespace, "rollouts", team)] = (cfg.partitions, keep)
        # ratings that arrive later (issue 31): kept as the rollouts are, keyed by the rated id
        specs[topic_name(namespace, "feedback", team)] = (cfg.partitions, keep)
    return {name: NewTopic(name, num_partitions=p, replication_factor=cfg.replication_factor, config=c)
            for name, (p, c) in specs.items()}


def ensure_topics(cfg: KafkaConfig, topics: dict[str, NewTopic], timeout: float = 30.0) -> list[str]:
    """Create the topics that do not exist yet; returns the names created. Idempotent."""
    admin = make_admin(cfg)
    existing = set(admin.list_topics(timeout=timeout).topics)
    missing = [t for name, t in topics.items() if name not in existing]
    if not missing:
        return []
    created = []
    for name, fut in admin.create_topics(missing, operation_timeout=timeout).items():
        try:
            fut.result()
            created.append(name)
        except KafkaException as e:
            if e.args[0].code() != 36:  # TOPIC_ALREADY_EXISTS: another role won the race
                raise
    _wait_for_metadata(admin, [t.topic for t in missing], timeout)
    return created


def _wait_for_metadata(admin: AdminClient, names: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        topics = admin.list_topics(timeout=timeout).topics
        if all(n in topics and topics[n].partitions for n in names):
            return
        time.sleep(0.1)
    raise KafkaException(f"topics {names} did not appear in metadata within {timeout}s")


@dataclass
class PartitionEnd:
    topic: str
    partition: int
    start: int
    end: int


def partition_ends(cfg: KafkaConfig, topic: str, idle_s: float = 1.0, max_s: float = 30.0) -> list[PartitionEnd]:
    """True [start, end) offsets of every partition of `topic`.

    The embedded broker reports a high watermark that can be far below the real end (the newest
    batch object's base offset + 1), so the reported value is only a lower bound: we read forward
    from it until we have read its last record and the partition is idle. On Apache Kafka that
    reads at most one record. While producers keep writing the end is a moving target: we stop
    after `max_s` instead of reading forever.
    """
    consumer = make_consumer(cfg, None)
    try:
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        if meta.error is not None:
            raise KafkaException(meta.error)
        ends = []
        for p in sorted(meta.partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            ends.append(PartitionEnd(topic, p, low, high))
        pending = {e.partition: e for e in ends if e.end > e.start or e.start == 0}
        if pending:
            consumer.assign([TopicPartition(topic, p, max(e.end - 1, e.start)) for p, e in pending.items()])
            # the record at end-1 exists: until it arrives, silence means a slow fetch, not the end
            # (unless it is a transaction marker, never delivered: hence the 5 * idle_s bound)
            unread = {p for p, e in pending.items() if e.end > e.start}
            started = last_data = time.monotonic()
            while True:
                msgs = consumer.consume(num_messages=10000, timeout=0.2)
                for m in msgs:
                    if m.error() is None:
                        e = pending[m.partition()]
                        e.end = max(e.end, m.offset() + 1)
                        unread.discard(m.partition())
                now = time.monotonic()
                if msgs:
                    last_data = now
                quiet = now - last_data >= idle_s
                if (quiet and (not unread or now - started >= 5 * idle_s)) or now - started >= max_s:
                    break
        return ends
    finally:
        consumer.close()


def read_topic(cfg: KafkaConfig, topic: str, deadline_s: float = 60.0, gaps=None) -> list:
    """Every record of `topic`, read once its writes are over: from each partition's start to its
    last record (`partition_ends`: the embedded broker's reported end offsets are wrong), which
    ends the partition (offsets the broker left empty are never delivered). Stops at `deadline_s`.
    `gaps` (an `offset_gaps.OffsetGaps`): read behind it, as the roles read (None: no guard)."""
    from streamrft.infra.offset_gaps import OffsetGaps, assign_guarded, take_contiguous

    gaps = gaps or OffsetGaps(0.0)  # a wait of 0: the check is off
    ends = partition_ends(cfg, topic)
    consumer = make_consumer(cfg, None)
    assign_guarded(consumer, gaps, [TopicPartition(topic, e.partition, e.start) for e in ends])
    left, got = {e.partition: e.end for e in ends if e.end > e.start}, []
    deadline = time.monotonic() + deadline_s
    try:
        while left and time.monotonic() < deadline:
            for m in take_contiguous(consumer, gaps, consumer.consume(1000, timeout=0.5)):
                if m.error() is None:
                    got.append(m)
                    if m.offset() + 1 >= left.get(m.partition(), 0):
                        left.pop(m.partition(), None)
    finally:
        consumer.close()
    return got


def read_at(cfg: KafkaConfig, locations: list[tuple[str, int, int]], timeout_s: float = 60.0) -> dict[tuple, bytes]:
    """The values of the records at these (topic, partition, offset)s, read by explicit offset (never
    by end offsets). A location the log no longer holds (retention) is missing from the result;
    one not read within `timeout_s` raises."""
    wanted: dict[tuple[str, int], set[int]] = {}
    for topic, partition, offset in locations:
        wanted.setdefault((topic, partition), set()).add(offset)
    out: dict[tuple, bytes] = {}
    if not wanted:
        return out
    consumer = make_consumer(cfg, None)
    try:
        consumer.assign([TopicPartition(t, p, min(offs)) for (t, p), offs in wanted.items()])
        left = {k: max(offs) for k, offs in wanted.items()}
        deadline = time.monotonic() + timeout_s
        while left:
            if time.monotonic() > deadline:
                raise KafkaException(f"could not read {sorted(left)} back by offset in {timeout_s} s")
            for m in consumer.consume(500, timeout=0.5):
                if m.error() is not None:
                    if m.error().fatal():
                        raise KafkaException(m.error())
                    continue
                key = (m.topic(), m.partition())
                if m.offset() in wanted.get(key, ()):
                    out[(m.topic(), m.partition(), m.offset())] = m.value()
                if key in left and m.offset() >= left[key]:
                    del left[key]  # past the last wanted offset: what was not seen is gone
        return out
    finally:
        consumer.close()


def committed_offsets(cfg: KafkaConfig, group_id: str, topic: str, partitions: list[int]) -> dict[int, int]:
    """Committed offset per partition for `group_id` (-1 where nothing is committed)."""
    consumer = make_consumer(cfg, group_id)
    try:
        tps = consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=10)
        return {tp.partition: tp.offset if tp.offset >= 0 else -1 for tp in tps}
    finally:
        consumer.close()


def decoded(msgs, topic: str, kind: type | None = None) -> Iterator[tuple]:
    """(message, record) for each of `msgs` that decodes (as `kind` when given), for the control
    topics a role only reads (weights announcements, admission ledgers): a consume error or a record
    that does not decode is logged and skipped; a fatal error raises."""
    for m in msgs:
        if m.error() is not None:
            if m.error().fatal():
                raise KafkaException(m.error())
            log.warning("consume error on %s: %s", topic, m.error())
            continue
        try:
            record = decode(m.value()) if kind is None else decode(m.value(), kind)
        except DecodeError as e:
            log.warning("bad record on %s offset %d: %s", topic, m.offset(), e)
            continue
        yield m, record
