"""Throughput of ONE stream-ops worker next to the raw aiokafka consume->produce rate, same data, same run.

    .venv/bin/python benchmarks/stream_ops_throughput.py [--groups 10000] [--group-size 1]

Starts a private embedded stack (free ports, a temp dir), produces N RolloutGroups (~2 KB at
group size 1) to one rollouts topic, then (1) copies them with aiokafka, the client faust uses,
without decoding, to a scratch topic, and (2) runs one stream-ops worker (`python -m
streamrft.stream_ops.cli_entry`, exact_match + GRPO, no filter) over the same records. Each rate
is N over a span that leaves out start-up and group joins: for the raw copy, from the first record
received to the last acknowledged; for stream ops, between the first and last experience's create
timestamps (set when the worker sends it). Prints both rates (groups/s and trajectories/s) and their ratio, then
stops the stack. On 2 shared cores the numbers move with whatever else runs.
"""
from __future__ import annotations

import argparse
import asyncio
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from confluent_kafka import OFFSET_BEGINNING, TopicPartition
from confluent_kafka.admin import NewTopic

from streamrft.config import KafkaConfig
from streamrft.infra.kafka import ensure_topics, flush_or_raise, make_consumer, make_producer, run_topics
from streamrft.infra.stack import EmbeddedStack, free_ports
from streamrft.schemas import RolloutGroup, Task, Trajectory, encode, topic_name

REPO = Path(__file__).resolve().parents[1]


def make_groups(n: int, group_size: int, response_tokens: int = 110, seed: int = 0) -> list[bytes]:
    """`n` encoded groups; at group size 1 each is about 2 KB (64 prompt + 110 response tokens)."""
    rng = random.Random(seed)
    out = []
    for g in range(n):
        gid = f"g{g}"
        task = Task(task_id=f"t{g}", prompt="rev abcdef=", answer="fedcba")
        trajs = [Trajectory(group_id=gid, task_id=task.task_id, model_version=0,
                            prompt_ids=[rng.randrange(300, 30000) for _ in range(64)],
                            response_ids=[rng.randrange(300, 30000) for _ in range(response_tokens)],
                            logprobs=[-rng.random() * 5 for _ in range(response_tokens)],
                            response_text=rng.choice(["fedcba", "fedcab"]))
                 for _ in range(group_size)]
        out.append(encode(RolloutGroup(group_id=gid, task=task, trajectories=trajs)))
    return out


def output_span(kafka: KafkaConfig, topic: str, partitions: int, n: int, timeout: float) -> tuple[int, float]:
    """(records read, seconds between the first and last create timestamps) of `topic`."""
    consumer = make_consumer(kafka, None)
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    stamps: list[int] = []
    deadline = time.monotonic() + timeout
    try:
        while len(stamps) < n and time.monotonic() < deadline:
            for m in consumer.consume(num_messages=5000, timeout=0.5):
                if m.error() is None:
                    stamps.append(m.timestamp()[1])
    finally:
        consumer.close()
    return len(stamps), (max(stamps) - min(stamps)) / 1000 if stamps else 0.0


async def raw_copy(bootstrap: str, source: str, target: str, partitions: int, n: int) -> float:
    """aiokafka: consume every record of `source`, produce it unchanged to `target` (acks=all).

    Returns the seconds from the first record received to the last one acknowledged.
    """
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.structs import TopicPartition as TP

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest")
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5, max_batch_size=1 << 20)
    await consumer.start()
    await producer.start()
    try:
        tps = [TP(source, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        pending, done, first = [], 0, None
        while done < n:
            batches = await consumer.getmany(timeout_ms=500, max_records=2000)
            if batches and first is None:
                first = time.monotonic()
            for records in batches.values():
                for r in records:
                    pending.append(await producer.send(target, r.value, key=r.key))
                    done += 1
            if len(pending) >= 2000:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
        return time.monotonic() - first
    finally:
        await producer.stop()
        await consumer.stop()


def run_stream_ops(kafka: KafkaConfig, ns: str, workdir: Path, n: int, timeout: float) -> float:
    """Run one worker subprocess until `n` experiences are out; returns their output span (s)."""
    config = workdir / "bench.yaml"
    config.write_text(yaml.safe_dump({
        "namespace": ns, "output_dir": str(workdir / "out"), "model": {"path": "unused"},
        "stack": {"embedded": False}, "kafka": kafka.model_dump(),
        "stream_ops": {"rewards": [{"name": "exact_match"}], "drop_zero_variance": False, "priority": "reward_std"},
    }))
    log = workdir / "worker.log"
    with open(log, "wb") as fh:
        worker = subprocess.Popen([sys.executable, "-m", "streamrft.stream_ops.cli_entry", str(config),
                                   "--worker-id", "bench"], stdout=fh, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        got, span = output_span(kafka, topic_name(ns, "experiences"), kafka.partitions, n, timeout)
        if got < n:
            raise SystemExit(f"stream ops produced {got}/{n} experiences; log {log}")
        return span
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(10)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=10000)
    ap.add_argument("--group-size", type=int, default=1)
    ap.add_argument("--partitions", type=int, default=4)
    args = ap.parse_args()
    n, ns = args.groups, "bench"

    with tempfile.TemporaryDirectory(prefix="so-bench-") as tmp:
        stack = EmbeddedStack(Path(tmp) / "stack", **free_ports())
        try:
            state = stack.up()
            kafka = KafkaConfig(bootstrap=state.kafka, partitions=args.partitions)
            source, raw_out = topic_name(ns, "rollouts", "default"), f"{ns}.raw-copy"
            topics = run_topics(kafka, ns)
            topics[raw_out] = NewTopic(raw_out, num_partitions=args.partitions, replication_factor=1)
            ensure_topics(kafka, topics)

            values = make_groups(n, args.group_size)
            size = sum(map(len, values)) / n
            producer = make_producer(kafka)
            for i, v in enumerate(values):
                producer.produce(source, v, f"g{i}".encode())
                if i % 5000 == 4999:
                    producer.poll(0)
            flush_or_raise(producer, 120)
            print(f"{n} RolloutGroups of {args.group_size} trajectories, {size:.0f} B each on average, "
                  f"{args.partitions} partitions, Tansu on SeaweedFS (s3://)")

            t0 = time.monotonic()
            raw_span = asyncio.run(raw_copy(state.kafka, source, raw_out, args.partitions, n))
            raw_wall = time.monotonic() - t0
            got, _ = output_span(kafka, raw_out, args.partitions, n, 60)
            assert got == n, f"raw copy wrote {got}/{n}"

            t0 = time.monotonic()
            so_span = run_stream_ops(kafka, ns, Path(tmp), n, timeout=600)
            so_wall = time.monotonic() - t0

            t = args.group_size
            raw_rate, so_rate = n / raw_span, n / so_span
            print(f"raw aiokafka consume->produce : {raw_rate:8.0f} groups/s {raw_rate * t:8.0f} traj/s "
                  f"({raw_span:.2f} s first record in to last ack, {raw_wall:.1f} s wall incl. connect)")
            print(f"stream-ops worker (1, faust)  : {so_rate:8.0f} groups/s {so_rate * t:8.0f} traj/s "
                  f"({so_span:.2f} s of output, {so_wall:.1f} s wall incl. start-up and join)")
            print(f"ratio stream-ops / raw        : {so_rate / raw_rate:8.3f}")
        finally:
            print(f"stack stopped: {', '.join(stack.down()) or 'nothing running'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
