"""Why the roles use confluent-kafka: produce and consume rates of the candidate clients, side by side.

    .venv/bin/python benchmarks/kafka_clients.py [--n 20000] [--size 2048]

On a private embedded stack (Tansu on SeaweedFS S3), each client produces N messages of SIZE
bytes (acks=all, `make_producer`'s defaults for confluent-kafka) to its own 4-partition topic, then
reads them all back by manual assignment from offset 0. Prints msgs/s and the ratio to
confluent-kafka (the choice). aiokafka is what faust uses inside stream ops.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path

from confluent_kafka import TopicPartition
from confluent_kafka.admin import NewTopic

from streamrft.config import KafkaConfig
from streamrft.infra.kafka import ensure_topics, flush_or_raise, make_consumer, make_producer
from streamrft.infra.stack import EmbeddedStack, free_ports


def bench_confluent(kafka: KafkaConfig, topic: str, payload: bytes, n: int) -> tuple[float, float]:
    producer = make_producer(kafka)
    t0 = time.perf_counter()
    for i in range(n):
        while True:
            try:
                producer.produce(topic, value=payload, partition=i % 4)
                break
            except BufferError:
                producer.poll(0.01)
        if i % 1000 == 0:
            producer.poll(0)
    flush_or_raise(producer, 120)
    produce = n / (time.perf_counter() - t0)
    consumer = make_consumer(kafka, None)
    consumer.assign([TopicPartition(topic, p, 0) for p in range(4)])
    got, t0 = 0, time.perf_counter()
    while got < n:
        got += sum(1 for m in consumer.consume(10000, timeout=1.0) if m.error() is None)
    consume = n / (time.perf_counter() - t0)
    consumer.close()
    return produce, consume


async def _aiokafka(bootstrap: str, topic: str, payload: bytes, n: int) -> tuple[float, float]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition as ATP

    # enable_idempotence=True fails on Tansu (InitProducerId -> UnknownError), one more reason
    # for confluent-kafka; faust's producer runs with plain acks=all the same way
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5, max_batch_size=1 << 20)
    await producer.start()
    t0 = time.perf_counter()
    futures = []
    for i in range(n):
        futures.append(await producer.send(topic, payload, partition=i % 4))
        if len(futures) >= 2000:
            await asyncio.gather(*futures)
            futures = []
    await asyncio.gather(*futures)
    produce = n / (time.perf_counter() - t0)
    await producer.stop()
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    consumer.assign([ATP(topic, p) for p in range(4)])
    for p in range(4):
        consumer.seek(ATP(topic, p), 0)
    got, t0 = 0, time.perf_counter()
    while got < n:
        batches = await consumer.getmany(timeout_ms=1000, max_records=10000)
        got += sum(len(v) for v in batches.values())
    consume = n / (time.perf_counter() - t0)
    await consumer.stop()
    return produce, consume


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--size", type=int, default=2048)
    args = ap.parse_args()
    payload = os.urandom(args.size)
    with tempfile.TemporaryDirectory() as tmp:
        es = EmbeddedStack(Path(tmp) / "stack", **free_ports())
        state = es.up()
        try:
            kafka = KafkaConfig(bootstrap=state.kafka)
            ensure_topics(kafka, {t: NewTopic(t, num_partitions=4, replication_factor=1) for t in ("b-confluent", "b-aiokafka")})
            results = {"confluent-kafka": bench_confluent(kafka, "b-confluent", payload, args.n),
                       "aiokafka": asyncio.run(_aiokafka(state.kafka, "b-aiokafka", payload, args.n))}
        finally:
            es.down()
    base = results["confluent-kafka"]
    print(f"{args.n} messages of {args.size} B, acks=all, embedded Tansu on S3, 4 partitions")
    for name, (p, c) in results.items():
        print(f"  {name:16} produce {p:9.0f} msg/s ({p / base[0]:.2f}x)   consume {c:9.0f} msg/s ({c / base[1]:.2f}x)")


if __name__ == "__main__":
    main()
