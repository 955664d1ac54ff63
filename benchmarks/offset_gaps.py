"""Records a live consumer skips on the embedded broker, plain vs behind `OffsetGaps`
(`kafka.gap_wait_s`), under two faults side by side in one run.

    .venv/bin/python benchmarks/offset_gaps.py [--seed 3] [--seconds 20] [--kills 6] [--gap-wait-s 10]

On a private embedded stack, 4 producers write batches of 1-4 records to one partition, and two
consumers read it live, side by side: plain librdkafka (fetch wait 500 ms, its default), and the
same behind `infra.offset_gaps.take_contiguous`. Afterwards the topic is read back whole. Faults:
- slow S3 writes: Tansu writes to SeaweedFS through `infra.chaos.DelayingS3Proxy`, which holds
  half the PUTs back up to 0.2 s (a loaded S3 server), for `--seconds`;
- kills: Tansu or SeaweedFS killed -9 and restarted, `--kills` times (more until a hole is met).
Prints, for each consumer, the records on the topic it never delivered; the holes the guard met,
how many filled (records the broker listed late) and after how long, how many it took as empty;
and the offsets no record fills.

Then the same slowed writes under a stream-ops worker (`python -m streamrft.stream_ops.cli_entry`,
`kafka.fetch_wait_ms=500`), with the guard off (`kafka.gap_wait_s=0`) and on, one after the other
on fresh stacks: 4 producers write rollout groups (rewards 1 and 0: never filtered) for
`--seconds`; once the worker's committed offset reaches the topic's end, the groups on the topic
with no experience are the ones it committed past without scoring.
"""
from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

from streamrft.config import KafkaConfig
from streamrft.infra.chaos import DelayingS3Proxy, read_through_server_kills
from streamrft.infra.kafka import (committed_offsets, ensure_topics, flush_or_raise, make_producer, partition_ends,
                                   read_topic, run_topics)
from streamrft.infra.stack import EmbeddedStack, free_ports
from streamrft.schemas import ExperienceGroup, RolloutGroup, Task, Trajectory, decode, encode, topic_name

ROOT = Path(__file__).resolve().parents[1]


def rollout_group(gid: str) -> RolloutGroup:
    task = Task(task_id=f"task-{gid}", prompt="2+2=", answer="4")
    return RolloutGroup(group_id=gid, team="red", task=task, trajectories=[
        Trajectory(traj_id=f"{gid}-{i}", group_id=gid, task_id=task.task_id, team="red", model_version=0,
                   prompt_ids=[1, 2], response_ids=[3], logprobs=[-0.1], response_text=text)
        for i, text in enumerate(["4", "5"])])


def stream_ops_under_slow_writes(gap_wait_s: float, seconds: float, seed: int) -> tuple[int, int]:
    """(groups on the topic, groups the worker never scored) under writes slowed by a proxy."""
    with tempfile.TemporaryDirectory() as tmp:
        es = EmbeddedStack(Path(tmp) / "stack", **free_ports())
        state = es.up()
        proxy = DelayingS3Proxy(state.s3, max_delay_s=0.2, seed=seed)
        worker = None
        try:
            es.kill("tansu")
            es.tansu_s3_endpoint = proxy.url
            es.restart("tansu")
            kafka = KafkaConfig(bootstrap=state.kafka, partitions=1, fetch_wait_ms=500, gap_wait_s=gap_wait_s)
            ns = "gaps"
            ensure_topics(kafka, run_topics(kafka, ns, teams=("red",)))
            red = topic_name(ns, "rollouts", "red")
            config = Path(tmp) / "run.yaml"
            config.write_text(yaml.safe_dump({
                "namespace": ns, "output_dir": str(Path(tmp) / "out"), "model": {"path": "unused"},
                "stack": {"embedded": False}, "kafka": kafka.model_dump(), "explorer": {"team": "red"},
                "stream_ops": {"rewards": [{"name": "exact_match"}]}}))
            with open(Path(tmp) / "worker.log", "wb") as log:
                worker = subprocess.Popen([sys.executable, "-m", "streamrft.stream_ops.cli_entry", str(config),
                                           "--worker-id", "w1"], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
            stop = threading.Event()

            def produce(index: int) -> None:
                rng, producer, n = random.Random(seed * 10 + index), make_producer(kafka), 0
                while not stop.is_set():
                    for _ in range(rng.randint(1, 4)):
                        gid = f"p{index}-{n}"
                        producer.produce(red, encode(rollout_group(gid)), gid.encode())
                        n += 1
                    flush_or_raise(producer)
                    time.sleep(rng.uniform(0, 0.03))

            threads = [threading.Thread(target=produce, args=(i,), daemon=True) for i in range(4)]
            for t in threads:
                t.start()
            time.sleep(seconds)
            stop.set()
            for t in threads:
                t.join(60)
            ends = {e.partition: e.end for e in partition_ends(kafka, red)}
            deadline = time.monotonic() + 120
            while committed_offsets(kafka, f"{ns}.stream-ops", red, list(ends)) != ends:
                if time.monotonic() > deadline or worker.poll() is not None:
                    raise RuntimeError(f"the worker did not commit to the end; see {tmp}/worker.log")
                time.sleep(0.5)
            on_topic = {decode(m.value(), RolloutGroup).group_id for m in read_topic(kafka, red, 120)}
            scored = {decode(m.value(), ExperienceGroup).group_id
                      for m in read_topic(kafka, topic_name(ns, "experiences"), 120)}
            return len(on_topic), len(on_topic - scored)
        finally:
            if worker is not None and worker.poll() is None:
                worker.terminate()
                worker.wait(30)
            es.down()
            proxy.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--kills", type=int, default=6)
    ap.add_argument("--gap-wait-s", type=float, default=10.0)
    args = ap.parse_args()
    faults = {"slow S3 writes": dict(slow_puts_s=0.2, duration_s=args.seconds),
              "kills": dict(min_kills=args.kills)}
    print(f"{'fault':<16}{'on topic':>9}{'plain missed':>14}{'guarded missed':>16}{'holes filled':>14}"
          f"{'skipped':>9}{'fill p50/max s':>16}{'empty offsets':>15}")
    for name, kw in faults.items():
        with tempfile.TemporaryDirectory() as tmp:
            es = EmbeddedStack(Path(tmp), **free_ports())
            try:
                state = es.up()
                r = read_through_server_kills(es, KafkaConfig(bootstrap=state.kafka), "gaps", seed=args.seed,
                                              gap_wait_s=args.gap_wait_s, **kw)
            finally:
                es.down()
        waits = r.fill_waits or [float("nan")]
        print(f"{name:<16}{r.on_topic:>9}{len(r.missed_raw):>14}{len(r.missed_guarded):>16}"
              f"{r.gaps['offset_holes_filled']:>14}{r.gaps['offset_holes_skipped']:>9}"
              f"{statistics.median(waits):>9.2f}/{max(waits):<6.2f}{len(r.holes):>15}", flush=True)
        if r.kills:
            print(f"  kills: {', '.join(r.kills)}")
        if r.lost:
            print(f"  acked but not on the topic: {len(r.lost)}")
    print(f"\nstream-ops worker, slow S3 writes, fetch wait 500 ms, {args.seconds:.0f} s of writes")
    print(f"{'kafka.gap_wait_s':<18}{'groups on topic':>16}{'never scored':>14}")
    for wait in (0.0, args.gap_wait_s):
        groups, lost = stream_ops_under_slow_writes(wait, args.seconds, args.seed)
        print(f"{wait:<18g}{groups:>16}{lost:>14}", flush=True)


if __name__ == "__main__":
    main()
