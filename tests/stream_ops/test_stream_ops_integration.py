"""Stream ops on the real embedded stack: a worker subprocess scores two teams' rollouts topics.

Good groups come out on experiences with the right rewards and advantages, malformed records land
on the DLQ with reason, source topic and offset without stalling their partition, zero-variance
groups are filtered and counted in the metrics; a second worker started after the first one
stopped resumes from the committed offsets.
"""
from __future__ import annotations

import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import pytest
import yaml
from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from streamrft.infra.kafka import committed_offsets, ensure_topics, flush_or_raise, make_consumer, make_producer, run_topics
from streamrft.schemas import DeadLetter, ExperienceGroup, Metric, RolloutGroup, Task, Trajectory, decode, encode, topic_name

ANSWER = "4"
BULK = 1000


def make_group(gid: str, team: str, responses: list[str]) -> RolloutGroup:
    task = Task(task_id=f"task-{gid}", prompt="2+2=", answer=ANSWER)
    trajs = [Trajectory(traj_id=f"{gid}-{i}", group_id=gid, task_id=task.task_id, team=team, model_version=0,
                        prompt_ids=[1, 2], response_ids=[3], logprobs=[-0.1], response_text=r)
             for i, r in enumerate(responses)]
    return RolloutGroup(group_id=gid, team=team, task=task, trajectories=trajs)


def expected_scores(responses: list[str]) -> tuple[list[float], list[float]]:
    """exact_match rewards and GRPO advantages (sample std, eps 1e-6) by hand."""
    r = [1.0 if x.strip() == ANSWER else 0.0 for x in responses]
    mean = sum(r) / len(r)
    std = math.sqrt(sum((v - mean) ** 2 for v in r) / (len(r) - 1))
    return r, [(v - mean) / (std + 1e-6) for v in r]


class Outputs:
    """Reads experiences, dlq and metrics of a namespace from the beginning, without a group."""

    def __init__(self, kafka, ns: str):
        self.consumer = make_consumer(kafka, None)
        tps = [TopicPartition(topic_name(ns, "experiences"), p, OFFSET_BEGINNING) for p in range(kafka.partitions)]
        tps += [TopicPartition(topic_name(ns, role), 0, OFFSET_BEGINNING) for role in ("dlq", "metrics")]
        self.consumer.assign(tps)
        self.experiences: list[ExperienceGroup] = []
        self.dead: list[DeadLetter] = []
        self.metrics: list[Metric] = []

    def wait_for(self, done, timeout: float, what: str, worker: subprocess.Popen, log: Path) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            assert worker.poll() is None, f"worker exited with {worker.returncode}; log:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}; log:\n{log.read_text()[-3000:]}"
            for m in self.consumer.consume(num_messages=1000, timeout=0.5):
                assert m.error() is None, m.error()
                msg = decode(m.value())
                {"experience_group": self.experiences, "dead_letter": self.dead, "metric": self.metrics}[msg.kind].append(msg)

    def close(self) -> None:
        self.consumer.close()

    def group_ids(self) -> set[str]:
        return {e.group_id for e in self.experiences}


def start_worker(config: Path, worker_id: str, log: Path) -> subprocess.Popen:
    with open(log, "ab") as fh:
        return subprocess.Popen([sys.executable, "-m", "streamrft.stream_ops.cli_entry", str(config),
                                 "--worker-id", worker_id], stdout=fh, stderr=subprocess.STDOUT,
                                cwd=Path(__file__).resolve().parents[2])


def stop_worker(proc: subprocess.Popen, log: Path) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
            raise AssertionError(f"worker ignored SIGTERM; log:\n{log.read_text()[-3000:]}")


def test_stream_ops_end_to_end_and_resume(stack, namespace, tmp_path):
    kafka = stack.kafka.model_copy(update={"partitions": 2})
    ensure_topics(kafka, run_topics(kafka, namespace, teams=("red", "blue")))
    red, blue = topic_name(namespace, "rollouts", "red"), topic_name(namespace, "rollouts", "blue")
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({
        "namespace": namespace, "output_dir": str(tmp_path / "out"), "model": {"path": "unused"},
        "stack": {"embedded": False}, "kafka": kafka.model_dump(),
        "stream_ops": {"rewards": [{"name": "exact_match"}], "drop_zero_variance": True, "priority": "reward_std"},
    }))
    producer = make_producer(kafka)
    where: dict[str, tuple[str, int, int]] = {}  # record label -> (topic, partition, offset)

    def produce(label: str, topic: str, partition: int, value: bytes, key: bytes | None = None) -> None:
        def on_delivery(err, msg):
            assert err is None, err
            where[label] = (msg.topic(), msg.partition(), msg.offset())
        producer.produce(topic, value, key, partition=partition, on_delivery=on_delivery)
        flush_or_raise(producer)  # one at a time: keeps the order within each partition

    good: dict[str, list[str]] = {}

    def produce_group(gid: str, team: str, topic: str, partition: int, responses: list[str]) -> None:
        good[gid] = responses
        produce(gid, topic, partition, encode(make_group(gid, team, responses)), gid.encode())

    bad_schema = make_group("bad-schema", "blue", ["4", "5"]).model_dump(by_alias=True)
    bad_schema["trajectories"][0]["logprobs"] = [0.7]
    # phase 1: bad records sit between good ones in the same partition
    produce_group("r1", "red", red, 0, ["4", "5"])
    produce("garbage", red, 0, b"\x00not msgpack", b"k-garbage")
    produce_group("r2", "red", red, 0, ["4", "5", "4", " 4"])
    produce("zero-var", red, 0, encode(make_group("zero-var", "red", ["4", "4"])), b"zero-var")
    produce_group("r3", "red", red, 1, ["x", "4", "5"])
    produce_group("b1", "blue", blue, 0, ["5", "4"])
    produce("bad-schema", blue, 0, msgpack.packb(bad_schema, use_bin_type=True), b"bad-schema")
    produce("wrong-team", blue, 0, encode(make_group("wrong-team", "red", ["4", "5"])), b"wrong-team")
    produce_group("b2", "blue", blue, 0, ["4", "5", "5", "5"])
    produce_group("b3", "blue", blue, 1, ["4", "44"])

    out = Outputs(kafka, namespace)
    try:
        log = tmp_path / "worker.log"
        worker = start_worker(config, "w1", log)
        try:
            out.wait_for(lambda: out.group_ids() >= set(good) and len(out.dead) >= 3, 60, "phase-1 outputs", worker, log)
            out.wait_for(lambda: any(m.values == {**m.values, "scored": 6, "filtered": 1, "dead_lettered": 3}
                                     for m in out.metrics), 15, "metrics counting every record", worker, log)
        finally:
            stop_worker(worker, log)

        for exp in out.experiences:
            rewards, advantages = expected_scores(good[exp.group_id])
            assert exp.rewards == rewards and exp.reward_components == {"exact_match": rewards}
            assert exp.advantages == pytest.approx(advantages, abs=1e-5), exp.group_id
            assert (exp.source_topic, exp.source_partition, exp.source_offset) == where[exp.group_id]
        assert "zero-var" not in out.group_ids()
        dead = {d.key.decode(): d for d in out.dead}
        assert set(dead) == {"k-garbage", "bad-schema", "wrong-team"}
        assert "not valid msgpack" in dead["k-garbage"].reason and dead["k-garbage"].value == b"\x00not msgpack"
        assert "trajectories.0.logprobs" in dead["bad-schema"].reason
        assert "arrived on team 'blue'" in dead["wrong-team"].reason
        for label, key in (("garbage", "k-garbage"), ("bad-schema", "bad-schema"), ("wrong-team", "wrong-team")):
            d = dead[key]
            assert (d.source_topic, d.source_partition, d.source_offset) == where[label]
            assert d.error_type == "InvalidRollout" and d.role == "stream_ops"
        assert {m.role_id for m in out.metrics} == {"w1"} and out.metrics[-1].values["groups_per_s"] >= 0

        # the clean stop committed everything it had acknowledged: the next worker starts after it
        group = f"{namespace}.stream-ops"
        assert committed_offsets(kafka, group, red, [0, 1]) == {0: 4, 1: 1}
        assert committed_offsets(kafka, group, blue, [0, 1]) == {0: 4, 1: 1}

        # phase 2: more input while no worker runs; a new worker is killed -9 mid-stream, a third one
        # resumes from whatever was committed: every group comes out at least once
        produce_group("r4", "red", red, 0, ["5", "4"])
        produce_group("b4", "blue", blue, 1, ["4", "x"])
        for i in range(BULK):
            gid, team = f"bulk-{i}", ("red", "blue")[i % 2]
            good[gid] = ["4", "5"]
            producer.produce(topic_name(namespace, "rollouts", team), encode(make_group(gid, team, good[gid])), gid.encode())
        flush_or_raise(producer)
        worker = start_worker(config, "w2", log)
        try:
            out.wait_for(lambda: len(out.group_ids() - set(where)) >= BULK // 10, 60, "some bulk outputs", worker, log)
        finally:
            worker.kill()
            worker.wait(10)
        out_at_kill = len(out.experiences)
        worker = start_worker(config, "w3", log)
        try:
            out.wait_for(lambda: out.group_ids() >= set(good), 60, "every group after the kill", worker, log)
        finally:
            stop_worker(worker, log)
        seen = [e.group_id for e in out.experiences]
        assert set(seen) == set(good)  # every group at least once, nothing lost
        assert seen.count("r1") == 1  # committed before w2 started: never redone
        print(f"killed -9 with {out_at_kill}/{len(good)} groups out; {len(seen) - len(set(seen))} redone after")
        assert len(out.dead) == 3  # the committed offsets kept the bad records from coming back
    finally:
        out.close()
