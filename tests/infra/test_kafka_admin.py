"""Topic admin, true end offsets and consumer lag, on the real embedded broker (session stack)."""
from __future__ import annotations

import threading
import time

from confluent_kafka import TopicPartition
from confluent_kafka.admin import ConfigResource, NewTopic, ResourceType

from streamrft.infra import status
from streamrft.infra.kafka import (
    committed_offsets,
    consume_ready,
    ensure_topics,
    flush_or_raise,
    make_admin,
    make_consumer,
    make_producer,
    partition_ends,
    run_topics,
)
from streamrft.schemas import topic_name


def _produce(kafka, topic: str, partition: int, n: int, producer=None) -> None:
    """n records to one partition, acknowledged before returning (one produce request per call)."""
    producer = producer or make_producer(kafka)
    for i in range(n):
        producer.produce(topic, key=f"k{i}".encode(), value=b"v" * 64, partition=partition)
    flush_or_raise(producer)


def test_ensure_topics_is_idempotent(stack, namespace):
    specs = run_topics(stack.kafka, namespace, teams=("red",))
    assert sorted(ensure_topics(stack.kafka, specs)) == sorted(specs)
    assert ensure_topics(stack.kafka, specs) == []
    # a new team adds its rollouts and feedback topics and nothing else
    more = run_topics(stack.kafka, namespace, teams=("red", "blue"))
    assert sorted(ensure_topics(stack.kafka, more)) == sorted(topic_name(namespace, role, "blue")
                                                              for role in ("rollouts", "feedback"))

    meta = make_admin(stack.kafka).list_topics(timeout=10).topics
    assert len(meta[topic_name(namespace, "experiences")].partitions) == stack.kafka.partitions
    assert len(meta[topic_name(namespace, "rollouts", "blue")].partitions) == stack.kafka.partitions
    assert len(meta[topic_name(namespace, "weights")].partitions) == 1


def test_weights_topic_is_compacted(stack, namespace):
    ensure_topics(stack.kafka, run_topics(stack.kafka, namespace))
    admin = make_admin(stack.kafka)
    weights = ConfigResource(ResourceType.TOPIC, topic_name(namespace, "weights"))
    experiences = ConfigResource(ResourceType.TOPIC, topic_name(namespace, "experiences"))
    found = {res.name: {k: v.value for k, v in fut.result().items()}
             for res, fut in admin.describe_configs([weights, experiences]).items()}
    assert found[weights.name]["cleanup.policy"] == "compact"
    assert found[experiences.name]["retention.ms"] == str(stack.kafka.retention_ms)


def test_partition_ends_are_true_ends(stack, namespace):
    topic = f"{namespace}.ends"
    ensure_topics(stack.kafka, {topic: NewTopic(topic, num_partitions=3, replication_factor=1)})
    empty = partition_ends(stack.kafka, topic, idle_s=0.5)
    assert [(e.partition, e.start, e.end) for e in empty] == [(0, 0, 0), (1, 0, 0), (2, 0, 0)]
    producer = make_producer(stack.kafka)
    for n in (100, 1, 50):  # uneven batches: the broker's own high watermark goes wrong here
        _produce(stack.kafka, topic, 0, n, producer)
    for n in (20, 5):
        _produce(stack.kafka, topic, 2, n, producer)
    del producer

    ends = {e.partition: (e.start, e.end) for e in partition_ends(stack.kafka, topic)}
    assert ends == {0: (0, 151), 1: (0, 0), 2: (0, 25)}

    # the broker's watermark is at best a lower bound (Tansu: newest batch's base offset + 1)
    consumer = make_consumer(stack.kafka, None)
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    finally:
        consumer.close()
    assert low == 0 and 1 <= high <= 151


def test_status_shows_lag_after_partial_commit(stack, namespace):
    topic = f"{namespace}.lag"
    group = f"{namespace}-group"
    ensure_topics(stack.kafka, {topic: NewTopic(topic, num_partitions=3, replication_factor=1)})
    for partition, n in ((0, 30), (1, 20), (2, 10)):
        _produce(stack.kafka, topic, partition, n)

    # a short session: the embedded broker holds each JoinGroup reply for half of it
    consumer = make_consumer(stack.kafka, group, **{"session.timeout.ms": 2000, "heartbeat.interval.ms": 500})
    consumer.subscribe([topic])
    next_offset: dict[int, int] = {}
    consumed, deadline = 0, time.monotonic() + 60
    while consumed < 25 and time.monotonic() < deadline:
        for m in consumer.consume(num_messages=25 - consumed, timeout=1.0):
            assert m.error() is None, m.error()
            next_offset[m.partition()] = m.offset() + 1
            consumed += 1
    assert consumed == 25
    consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in next_offset.items()], asynchronous=False)
    consumer.close()
    assert committed_offsets(stack.kafka, group, topic, [0, 1, 2]) == {p: next_offset.get(p, -1) for p in range(3)}

    st = status.collect(stack.kafka, stack.s3, [stack.s3.bucket], topic_prefix=namespace)
    assert st.kafka_ok and st.s3_ok, st.errors
    assert st.topics[topic] == [(0, 0, 30), (1, 0, 20), (2, 0, 10)]
    (lag,) = [g for g in st.groups if g.group == group]
    ends = {0: 30, 1: 20, 2: 10}
    assert lag.topic == topic and lag.committed == next_offset
    assert lag.lag == {p: ends[p] - next_offset.get(p, 0) for p in range(3)}
    assert lag.total_lag == 60 - 25
    assert st.buckets[stack.s3.bucket] >= 0

    text = status.render(st)
    assert group in text and "lag=35" in text and topic in text


def test_partition_ends_returns_while_producers_write(stack, namespace):
    topic = f"{namespace}.busy"
    ensure_topics(stack.kafka, {topic: NewTopic(topic, num_partitions=1, replication_factor=1)})
    _produce(stack.kafka, topic, 0, 10)
    stop = threading.Event()

    def keep_writing():  # faster than the idle period: the partition never goes quiet
        producer = make_producer(stack.kafka)
        while not stop.is_set():
            producer.produce(topic, value=b"tick", partition=0)
            producer.flush(1)
            time.sleep(0.05)

    writer = threading.Thread(target=keep_writing, daemon=True)
    writer.start()
    try:
        t0 = time.monotonic()
        (end,) = partition_ends(stack.kafka, topic, idle_s=1.0, max_s=2.0)
        assert time.monotonic() - t0 < 10
    finally:
        stop.set()
        writer.join(10)
    assert end.end >= 10


def test_consume_ready_takes_what_has_come_without_waiting_out_its_timeout(stack, namespace):
    """librdkafka's consume(64, timeout) returns 3 records only once its timeout has passed;
    consume_ready returns them as soon as the first is there, and a loop-path consumer fetches
    with kafka.fetch_wait_ms."""
    topic = f"{namespace}.ready"
    ensure_topics(stack.kafka, {topic: NewTopic(topic, num_partitions=1, replication_factor=1)})
    _produce(stack.kafka, topic, 0, 3)
    consumer = make_consumer(stack.kafka.model_copy(update={"fetch_wait_ms": 50}), None, loop_path=True)
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        got, t0 = [], time.monotonic()
        while len(got) < 3 and time.monotonic() - t0 < 30:
            got += [m for m in consume_ready(consumer, 64, timeout=60) if m.error() is None]
        assert [m.offset() for m in got] == [0, 1, 2]
        assert time.monotonic() - t0 < 30  # never the 60 s timeout
        assert consume_ready(consumer, 64, timeout=0.2) == []  # nothing new: the timeout, then nothing
    finally:
        consumer.close()
