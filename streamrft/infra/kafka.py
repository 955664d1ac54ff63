"""Kafka client factories, idempotent topic admin and end offsets that are right on any broker.

Every role except stream ops uses confluent-kafka (librdkafka). Measured here with
`benchmarks/kafka_clients.py` (20k x 2 KB, acks=all, Tansu on S3): aiokafka produces faster
(1.5-2.2x, it cannot be idempotent there) and consumes a little slower (0.8-0.9x). We still take
confluent-kafka because its idempotent producer works on the embedded broker (aiokafka's fails
InitProducerId with UnknownError), so retries never duplicate a record; its API is synchronous,
as explorers and the trainer are; and it speaks SASL/SCRAM to a real cluster. faust brings its
own aiokafka clients, configured from the same `KafkaConfig` in `stream_ops/app.py`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from streamrft.config import KafkaConfig
from streamrft.schemas import topic_name


def client_conf(cfg: KafkaConfig) -> dict:
    # log_level 4: warnings and errors only (librdkafka's info lines are noise in role logs)
    conf = {"bootstrap.servers": cfg.bootstrap, "security.protocol": cfg.security_protocol, "log_level": 4}
    if cfg.sasl_mechanism:
        conf.update({"sasl.mechanism": cfg.sasl_mechanism, "sasl.username": cfg.username or "",
                     "sasl.password": cfg.password or ""})
    conf.update(cfg.extra)
    return conf


def make_producer(cfg: KafkaConfig, **overrides) -> Producer:
    """acks=all + idempotence: an acknowledged record is durable and never duplicated by retries."""
    conf = {**client_conf(cfg), "acks": "all", "enable.idempotence": True, "linger.ms": 5,
            "message.max.bytes": 16 * 1024 * 1024, "compression.type": "none"}
    conf.update(overrides)
    return Producer(conf)


def make_consumer(cfg: KafkaConfig, group_id: str | None, **overrides) -> Consumer:
    """Explicit commits only; a new group starts at `earliest` (never `latest`, see DEVELOPERS.md)."""
    conf = {**client_conf(cfg), "group.id": group_id or "streamrft-probe", "enable.auto.commit": False,
            "auto.offset.reset": "earliest", "session.timeout.ms": cfg.session_timeout_ms,
            "heartbeat.interval.ms": cfg.heartbeat_interval_ms, "enable.partition.eof": False,
            "fetch.max.bytes": 64 * 1024 * 1024, "max.partition.fetch.bytes": 16 * 1024 * 1024}
    conf.update(overrides)
    return Consumer(conf)


def make_admin(cfg: KafkaConfig) -> AdminClient:
    return AdminClient(client_conf(cfg))


def flush_or_raise(producer: Producer, timeout: float = 30.0) -> None:
    left = producer.flush(timeout)
    if left:
        raise KafkaException(f"{left} records not acknowledged after {timeout}s")


def run_topics(cfg: KafkaConfig, namespace: str, teams: list[str] | tuple[str, ...] = ("default",)) -> dict[str, NewTopic]:
    """The topics of one run: name -> spec (partitions, retention, the weights topic compacted)."""
    keep = {"retention.ms": str(cfg.retention_ms)}
    specs = {
        topic_name(namespace, "tasks"): (cfg.partitions, keep),
        topic_name(namespace, "experiences"): (cfg.partitions, keep),
        topic_name(namespace, "weights"): (1, {"cleanup.policy": "compact"}),
        topic_name(namespace, "metrics"): (1, keep),
        topic_name(namespace, "dlq"): (1, keep),
    }
    for team in teams:
        specs[topic_name(namespace, "rollouts", team)] = (cfg.partitions, keep)
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


def committed_offsets(cfg: KafkaConfig, group_id: str, topic: str, partitions: list[int]) -> dict[int, int]:
    """Committed offset per partition for `group_id` (-1 where nothing is committed)."""
    consumer = make_consumer(cfg, group_id)
    try:
        tps = consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=10)
        return {tp.partition: tp.offset if tp.offset >= 0 else -1 for tp in tps}
    finally:
        consumer.close()
