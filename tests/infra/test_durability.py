"""Acceptance test of the embedded stack's durability: kill -9 the broker, then the S3 server.

10,000 encoded Trajectories go to a 4-partition topic (acks=all, idempotent); a group consumes
6,000 and commits exactly those. After `kill -9` + restart of Tansu, and again of SeaweedFS, every
record is still readable from offset 0 and the group resumes exactly after its commit. Uses a
private stack (it kills processes) and never trusts the broker's end offsets (wrong on Tansu).
"""
from __future__ import annotations

import time
from collections import Counter

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import NewTopic

from streamrft.infra.kafka import (
    committed_offsets,
    ensure_topics,
    flush_or_raise,
    make_consumer,
    make_producer,
    partition_ends,
)
from streamrft.infra.stack import pid_alive
from streamrft.schemas import Trajectory, decode, encode

pytestmark = pytest.mark.slow

N, COMMIT_AT, PARTITIONS = 10_000, 6_000, 4


def _trajectory(i: int) -> Trajectory:
    return Trajectory(traj_id=f"traj-{i:05d}", group_id=f"group-{i // 8}", task_id=f"task-{i // 8}",
                      model_version=i % 7, prompt_ids=list(range(64)),
                      response_ids=[(i * 31 + j) % 50_000 for j in range(128)],
                      logprobs=[-((i + j) % 97) / 10 for j in range(128)])


def _drain(consumer, want: int, idle_s: float, deadline_s: float = 120.0) -> list:
    """Consume until `want` records arrived and then `idle_s` passed with nothing more (or the deadline)."""
    got: list = []
    deadline = time.monotonic() + deadline_s
    last = time.monotonic()
    while time.monotonic() < deadline:
        msgs = consumer.consume(num_messages=1000, timeout=0.5)
        for m in msgs:
            assert m.error() is None, m.error()
            got.append(m)
        if msgs:
            last = time.monotonic()
        elif len(got) >= want and time.monotonic() - last >= idle_s:
            break
    return got


def _ids(msgs) -> list[str]:
    return [decode(m.value(), Trajectory).traj_id for m in msgs]


def _check_intact(kafka, topic: str, group: str, committed: dict[int, int], remaining: set[str]) -> None:
    all_ids = {f"traj-{i:05d}" for i in range(N)}

    # 1. every record is readable from offset 0 of each partition, once
    reader = make_consumer(kafka, None)
    try:
        reader.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        msgs = _drain(reader, N, idle_s=2.0)
    finally:
        reader.close()
    ids = _ids(msgs)
    assert len(ids) == N and set(ids) == all_ids, f"{len(ids)} read, {len(set(ids))} distinct, {len(all_ids - set(ids))} missing"
    per_partition = Counter(m.partition() for m in msgs)
    ends = {e.partition: e.end for e in partition_ends(kafka, topic)}
    assert ends == {p: per_partition[p] for p in range(PARTITIONS)}

    # 2. the group's commit survived as it was
    assert committed_offsets(kafka, group, topic, list(range(PARTITIONS))) == committed

    # 3. the group resumes exactly after it: the other 4,000, none twice, none missing. No commit
    #    here, so the next phase resumes from the same place.
    consumer = make_consumer(kafka, group)
    try:
        consumer.subscribe([topic])
        msgs = _drain(consumer, N - COMMIT_AT, idle_s=3.0)
    finally:
        consumer.close()
    ids = _ids(msgs)
    assert len(ids) == len(set(ids)), "a record was delivered twice"
    assert set(ids) == remaining, f"{len(remaining - set(ids))} missing, {len(set(ids) - remaining)} extra"
    assert all(m.offset() >= max(committed[m.partition()], 0) for m in msgs)


def test_kill_broker_then_s3_loses_nothing(private_stack):
    kafka, es = private_stack.kafka, private_stack.embedded
    topic, group = "durability.rollouts", "durability-group"
    ensure_topics(kafka, {topic: NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)})

    producer = make_producer(kafka)
    sizes = []
    for i in range(N):
        value = encode(_trajectory(i))
        sizes.append(len(value))
        producer.produce(topic, key=f"traj-{i:05d}".encode(), value=value)
        producer.poll(0)
    flush_or_raise(producer, timeout=120)
    del producer
    assert 1000 <= sum(sizes) / N <= 2048

    # consume exactly 6,000 through a group and commit what was processed, per partition
    consumer = make_consumer(kafka, group)
    consumer.subscribe([topic])
    processed: list[str] = []
    offsets: dict[int, list[int]] = {}
    deadline = time.monotonic() + 120
    while len(processed) < COMMIT_AT and time.monotonic() < deadline:
        for m in consumer.consume(num_messages=min(500, COMMIT_AT - len(processed)), timeout=1.0):
            assert m.error() is None, m.error()
            processed.append(decode(m.value(), Trajectory).traj_id)
            offsets.setdefault(m.partition(), []).append(m.offset())
    assert len(processed) == COMMIT_AT == len(set(processed))
    for p, seen in offsets.items():  # a group reads each partition in order from `earliest`
        assert seen == list(range(len(seen))), f"partition {p} not read in order"
    committed = {p: len(offsets[p]) if p in offsets else -1 for p in range(PARTITIONS)}
    consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in committed.items() if o >= 0], asynchronous=False)
    consumer.close()
    assert committed_offsets(kafka, group, topic, list(range(PARTITIONS))) == committed
    remaining = {f"traj-{i:05d}" for i in range(N)} - set(processed)

    for name in ("tansu", "weed"):
        old_pid = es.load_state().procs[name].pid
        es.kill(name)  # SIGKILL
        assert not pid_alive(old_pid)
        t0 = time.monotonic()
        es.restart(name)
        new_pid = es.load_state().procs[name].pid
        assert new_pid != old_pid and pid_alive(new_pid, name)
        print(f"{name}: kill -9 and restart in {time.monotonic() - t0:.1f}s")
        _check_intact(kafka, topic, group, committed, remaining)

    # the log goes on at the right offsets after both restarts: nothing is overwritten
    before = {e.partition: e.end for e in partition_ends(kafka, topic)}
    producer = make_producer(kafka)
    for i in range(N, N + 100):
        producer.produce(topic, key=f"traj-{i:05d}".encode(), value=encode(_trajectory(i)))
    flush_or_raise(producer)
    del producer
    after = {e.partition: e.end for e in partition_ends(kafka, topic)}
    assert sum(after.values()) == N + 100 and all(after[p] >= before[p] for p in before)
