"""Every produce checks its delivery report (`CheckedProducer`, `flush_or_raise`), on the real stack.

- S3 killed and restarted under a producing client: Tansu answers UNKNOWN, then fences the
  idempotent producer (PRODUCER_FENCED on every later record, nothing on error_cb; a plain
  confluent producer loses ~180 of 400 records there while `flush()` returns 0). The checked
  producer replaces itself and re-sends: every record is readable afterwards.
- Broker down: `flush_or_raise` raises `DeliveryError` instead of returning, and `serve` (the
  non-blocking publisher's) calls no delivery callback; once the broker is back, the same records
  are delivered.
- A record the client refuses for itself raises at once.
- The broker killed mid-produce, again and again: no acknowledged record is lost (with
  idempotence on, Tansu loses some: hence `KafkaConfig.idempotence=False` by default).
"""
from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import NewTopic

from streamrft.infra.chaos import produce_through_broker_kills
from streamrft.infra.kafka import DeliveryError, ensure_topics, flush_or_raise, make_consumer, make_producer

pytestmark = pytest.mark.slow


def _read_values(kafka, topic: str, partitions: int, want: int, deadline_s: float = 30.0) -> set[int]:
    consumer = make_consumer(kafka, None)
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got: set[int] = set()
    deadline = time.monotonic() + deadline_s
    try:
        while len(got) < want and time.monotonic() < deadline:
            got |= {int(m.value()) for m in consumer.consume(1000, timeout=0.5) if m.error() is None}
    finally:
        consumer.close()
    return got


def test_s3_restart_under_a_producer_loses_nothing(private_stack):
    kafka, es = private_stack.kafka, private_stack.embedded
    ensure_topics(kafka, {"fence": NewTopic("fence", num_partitions=2, replication_factor=1)})
    producer = make_producer(kafka)
    for i in range(200):
        producer.produce("fence", key=str(i), value=str(i))
    flush_or_raise(producer)

    def bounce() -> None:
        time.sleep(0.5)
        es.kill("weed")
        time.sleep(3)
        es.restart("weed")

    thread = threading.Thread(target=bounce)
    thread.start()
    for i in range(200, 400):  # produced while the broker's store goes away and comes back
        producer.produce("fence", key=str(i), value=str(i))
        producer.poll(0)
        time.sleep(0.03)
    thread.join()
    flush_or_raise(producer, timeout=120)
    print(f"producer replaced {producer.replaced}x, re-sent {producer.resent} records")

    got = _read_values(kafka, "fence", 2, 400)
    assert got == set(range(400)), f"{len(set(range(400)) - got)} records lost"


def test_broker_down_fails_loudly_then_delivers(private_stack):
    kafka, es = private_stack.kafka, private_stack.embedded
    ensure_topics(kafka, {"down": NewTopic("down", num_partitions=1, replication_factor=1)})
    producer = make_producer(kafka)
    producer.produce("down", value=b"0")
    flush_or_raise(producer)

    es.kill("tansu")
    producer.produce("down", value=b"1")
    with pytest.raises(DeliveryError, match="not acknowledged"):
        flush_or_raise(producer, timeout=3)
    assert len(producer) == 1  # still owed, never counted as sent
    # the publisher that never blocks (`serve`, the per-episode explorer's): no callback, still owed
    acked = []
    producer.produce("down", value=b"2", on_delivery=lambda err, msg: acked.append(msg.offset()))
    for _ in range(20):
        producer.serve()
        time.sleep(0.05)
    assert acked == [] and len(producer) == 2

    es.restart("tansu")
    deadline = time.monotonic() + 120
    while not acked and time.monotonic() < deadline:  # served and re-sent without a blocking flush
        producer.serve()
        time.sleep(0.05)
    assert len(acked) == 1
    flush_or_raise(producer, timeout=120)
    assert len(producer) == 0
    assert _read_values(kafka, "down", 1, 3) == {0, 1, 2}


def test_a_record_refused_for_itself_raises(stack):
    producer = make_producer(stack.kafka, **{"message.max.bytes": 2000})
    with pytest.raises(DeliveryError, match="refused"):
        producer.produce("never-created", value=b"x" * 10_000)
    assert len(producer) == 0


def test_broker_killed_mid_produce_loses_no_acked_record(private_stack):
    """kill -9 the broker a few ms after a produce, 8 times: every acknowledged record is on the
    topic. With `idempotence=True` this fails on Tansu 0.6 (it acks a retried batch it never
    stored: `benchmarks/broker_kill_durability.py`); the default is at-least-once."""
    report = produce_through_broker_kills(private_stack.embedded, private_stack.kafka, "kills", kills=8, seed=4)
    print(f"acked {report.acked}, lost {report.lost}, delivered twice {report.twice}")
    assert report.acked > 100
    assert not report.lost, f"acknowledged records lost: {report.lost}"


def test_a_dropped_producer_is_freed_at_once_and_close_stops_it(stack):
    """No reference cycle through the C producer's callbacks: a producer nobody holds is freed when
    dropped, not at a later garbage collection (meanwhile it kept reconnecting to brokers that may
    be gone). `close` drops what was not acknowledged and may be called twice."""
    import gc
    import weakref

    gc.disable()
    try:
        producer = make_producer(stack.kafka)
        ref = weakref.ref(producer)
        del producer
        assert ref() is None
    finally:
        gc.enable()
    producer = make_producer(stack.kafka)
    producer.produce("streamrft-test-never-created", value=b"x")
    producer.close()
    producer.close()
