"""Produce through broker crashes and count what the broker lost: the check behind
`KafkaConfig.idempotence` (used by its test and `benchmarks/broker_kill_durability.py`)."""
from __future__ import annotations

import random
import threading
import time
from collections import Counter
from dataclasses import dataclass

from confluent_kafka import TopicPartition
from confluent_kafka.admin import NewTopic

from streamrft.config import KafkaConfig
from streamrft.infra.kafka import DeliveryError, ensure_topics, flush_or_raise, make_consumer, make_producer, partition_ends
from streamrft.infra.stack import EmbeddedStack


@dataclass
class KillReport:
    acked: int
    lost: list[int]  # acknowledged, yet not on the topic
    twice: list[int]  # on the topic more than once


def produce_through_broker_kills(es: EmbeddedStack, kafka: KafkaConfig, topic: str, kills: int,
                                 seed: int = 0) -> KillReport:
    """Send records 0, 1, 2, ... one at a time, each flushed until acked, while the broker is killed
    (SIGKILL, a few ms after a produce) and restarted `kills` times; then read the topic back."""
    rng = random.Random(seed)
    ensure_topics(kafka, {topic: NewTopic(topic, num_partitions=1, replication_factor=1)})
    acked: list[int] = []
    stop, sent = threading.Event(), threading.Event()

    def produce() -> None:
        producer, i = make_producer(kafka), 0
        while not stop.is_set():
            producer.produce(topic, key=b"k", value=str(i).encode())
            sent.set()
            try:
                flush_or_raise(producer, timeout=60)
                acked.append(i)
            except DeliveryError:
                pass  # not acknowledged: not counted, may or may not be on the topic
            i += 1
            time.sleep(rng.uniform(0, 0.05))

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    try:
        for _ in range(kills):
            time.sleep(rng.uniform(1, 3))
            sent.clear()
            sent.wait(30)
            time.sleep(rng.uniform(0, 0.03))
            es.kill("tansu")
            time.sleep(rng.uniform(0, 2))
            es.restart("tansu")
        time.sleep(2)
    finally:
        stop.set()
        thread.join(120)

    (end,) = partition_ends(kafka, topic)
    consumer = make_consumer(kafka, None)
    consumer.assign([TopicPartition(topic, 0, end.start)])
    values: list[int] = []
    deadline = time.monotonic() + 60
    try:
        while len(values) < end.end - end.start and time.monotonic() < deadline:
            values += [int(m.value()) for m in consumer.consume(1000, timeout=0.5) if m.error() is None]
    finally:
        consumer.close()
    on_topic = Counter(values)
    return KillReport(acked=len(acked), lost=[i for i in acked if i not in on_topic],
                      twice=[i for i, n in on_topic.items() if n > 1])
