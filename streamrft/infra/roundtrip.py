"""`streamrft roundtrip`: a smoke run of the plumbing that prints what happened.

Brings the embedded stack up (unless the config names external ones), creates a run's topics,
produces RolloutGroups and reads them back through a consumer group with an explicit commit,
publishes a safetensors weight version with its manifest and fetches it back verified, then
brings the stack down again.
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

from streamrft.config import KafkaConfig, S3Config, StackConfig
from streamrft.infra.kafka import ensure_topics, flush_or_raise, make_consumer, make_producer, partition_ends, run_topics
from streamrft.infra.objectstore import WeightStore
from streamrft.schemas import RolloutGroup, Task, Trajectory, decode, encode, topic_name


def _sample_group(i: int) -> RolloutGroup:
    task = Task(prompt=f"reverse: abc{i}", answer=f"{i}cba")
    gid = f"group-{i}"
    trajs = [Trajectory(group_id=gid, task_id=task.task_id, model_version=0, prompt_ids=[1, 2, 3],
                        response_ids=[4, 5], logprobs=[-0.5, -1.25]) for _ in range(4)]
    return RolloutGroup(group_id=gid, task=task, trajectories=trajs)


def roundtrip(stack: StackConfig, kafka: KafkaConfig, s3: S3Config, keep_up: bool = False, n: int = 200) -> int:
    from streamrft.infra.stack import embedded_stack, resolve_clients

    es = embedded_stack(stack, s3) if stack.embedded else None
    started = False
    if es is not None:
        started = not any(es.running().values())
        t0 = time.monotonic()
        state = es.up()
        print(f"stack up in {time.monotonic() - t0:.1f}s: kafka {state.kafka}, s3 http://{state.s3}")
        kafka, s3 = resolve_clients(stack, kafka, s3)
    try:
        ns = f"roundtrip{int(time.time())}"
        created = ensure_topics(kafka, run_topics(kafka, ns))
        print(f"created {len(created)} topics for namespace {ns!r}: {', '.join(created)}")

        topic = topic_name(ns, "rollouts", "default")
        producer = make_producer(kafka)
        t0 = time.monotonic()
        for i in range(n):
            g = _sample_group(i)
            producer.produce(topic, key=g.group_id.encode(), value=encode(g))
        flush_or_raise(producer)
        print(f"produced {n} RolloutGroups (acks=all, delivery checked) in {time.monotonic() - t0:.2f}s")

        consumer = make_consumer(kafka, f"{ns}-reader")
        consumer.subscribe([topic])
        got, t0 = 0, time.monotonic()
        while got < n and time.monotonic() - t0 < 60:
            for m in consumer.consume(500, timeout=1.0):
                if m.error() is None:
                    decode(m.value(), RolloutGroup)
                    got += 1
        consumer.commit(asynchronous=False)
        consumer.close()
        ends = sum(e.end for e in partition_ends(kafka, topic))
        print(f"consumed and decoded {got}/{n} in {time.monotonic() - t0:.2f}s, committed; topic end offsets sum to {ends}")

        store = WeightStore(s3)
        store.ensure_bucket()
        with tempfile.TemporaryDirectory() as tmp:
            weights = {"layer.weight": np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)}
            shard = Path(tmp) / "model.safetensors"
            save_file(weights, str(shard))
            manifest = store.publish_version(ns, 1, [shard])
            print(f"published {ns}/v1 ({shard.stat().st_size} bytes, manifest sha256 {manifest.sha256[:12]}…); "
                  f"versions listed: {store.list_versions(ns)}")
            store.fetch_version(ns, 1, Path(tmp) / "fetched")
            same = np.array_equal(load_file(str(Path(tmp) / "fetched" / shard.name))["layer.weight"], weights["layer.weight"])
            print(f"fetched v1, checksums verified, tensors identical: {same}")
        ok = got == n and ends == n and same
    finally:
        if es is not None and started and not keep_up:
            print(f"stack down: stopped {', '.join(es.down())}")
    print("roundtrip OK" if ok else "roundtrip FAILED")
    return 0 if ok else 1
