"""Stream ops on the real embedded stack: a worker subprocess scores two teams' rollouts topics.

Good groups come out on experiences with the right rewards and advantages, malformed records land
on the DLQ with reason, source topic and offset without stalling their partition, zero-variance
groups are filtered and counted in the metrics, every scored group's rewards (filtered ones too)
reach the task-stats topic; a second worker started after the first one
stopped resumes from the committed offsets. When the broker dies under a worker, its sends fail
and it exits non-zero within a bound instead of acking; after the broker is back, workers (one
stopped by SIGTERM mid-stream) redo what was not committed and every group comes out.
"""
from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.request import urlopen

import msgpack
import pytest
import yaml
from confluent_kafka import OFFSET_BEGINNING, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from streamrft.infra.kafka import (committed_offsets, ensure_topics, flush_or_raise, make_consumer, make_producer,
                                   partition_ends, run_topics)
from streamrft.schemas import (DeadLetter, ExperienceGroup, Metric, RolloutGroup, Task, TaskOutcome, Trajectory, decode,
                               encode, topic_name)
from streamrft.stream_ops.app import STOP_GRACE_S
from tests_helpers import read_all

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
            self._read()

    def drain(self, idle_s: float = 2.0) -> None:
        """Read what is there until nothing new comes for `idle_s` (no worker needed)."""
        last = time.monotonic()
        while time.monotonic() - last < idle_s:
            if self._read():
                last = time.monotonic()

    def _read(self) -> int:
        msgs = self.consumer.consume(num_messages=1000, timeout=0.5)
        for m in msgs:
            assert m.error() is None, m.error()
            msg = decode(m.value())
            {"experience_group": self.experiences, "dead_letter": self.dead, "metric": self.metrics}[msg.kind].append(msg)
        return len(msgs)

    def close(self) -> None:
        self.consumer.close()

    def group_ids(self) -> set[str]:
        return {e.group_id for e in self.experiences}


def start_worker(config: Path, worker_id: str, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    with open(log, "ab") as fh:
        return subprocess.Popen([sys.executable, "-m", "streamrft.stream_ops.cli_entry", str(config),
                                 "--worker-id", worker_id], stdout=fh, stderr=subprocess.STDOUT,
                                cwd=Path(__file__).resolve().parents[2], env={**os.environ, **(env or {})})


def stop_worker(proc: subprocess.Popen, log: Path, within: float = 15.0) -> float:
    """SIGTERM; the worker must be gone within `within` seconds, with exit code 0. Returns the time taken."""
    started = time.monotonic()
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(within)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
            raise AssertionError(f"worker ignored SIGTERM for {within} s; log:\n{log.read_text()[-3000:]}")
    assert proc.returncode == 0, f"worker exited with {proc.returncode}; log:\n{log.read_text()[-3000:]}"
    return time.monotonic() - started


def test_stream_ops_end_to_end_and_resume(stack, namespace, tmp_path):
    kafka = stack.kafka.model_copy(update={"partitions": 2})
    ensure_topics(kafka, run_topics(kafka, namespace, teams=("red", "blue")))
    red, blue = topic_name(namespace, "rollouts", "red"), topic_name(namespace, "rollouts", "blue")
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({
        "namespace": namespace, "output_dir": str(tmp_path / "out"), "model": {"path": "unused"},
        "stack": {"embedded": False}, "kafka": kafka.model_dump(),
        "stream_ops": {"rewards": [{"name": "exact_match"}], "drop_zero_variance": True, "priority": "reward_std"},
        "monitor": {"prometheus": {"enabled": True, "port_base": 0}},  # /metrics on a free port, in its log
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
            # the same counts on the worker's Prometheus endpoint, scraped while it runs
            url = re.search(r"prometheus: stream_ops metrics on (http://\S+)", log.read_text()).group(1)
            families = {f.name: f for f in text_string_to_metric_families(urlopen(url, timeout=10).read().decode())}
            for name, count in (("scored", 6), ("filtered", 1), ("dead_lettered", 3)):
                f = families[f"streamrft_stream_ops_{name}"]
                assert f.type == "counter" and [(s.labels, s.value) for s in f.samples] == [({"role_id": "w1"}, count)]
            assert families["streamrft_stream_ops_score_s"].samples[0].value > 0
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
        # every scored group's episode rewards went to the task-stats topic, the filtered one included
        outcomes = {o.group_id: o for o in (decode(m.value(), TaskOutcome)
                                            for m in read_all(kafka, topic_name(namespace, "task-stats")))}
        assert set(outcomes) == set(good) | {"zero-var"}
        assert outcomes["zero-var"].rewards == [1.0, 1.0] and outcomes["r2"].rewards == [1.0, 0.0, 1.0, 1.0]
        assert outcomes["r2"].task_id == "task-r2"

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
            # w3 must be up (its metrics timer runs) before it is stopped: w2 may have put everything
            # out before its kill, and a worker stopped while still starting proves nothing
            out.wait_for(lambda: out.group_ids() >= set(good) and any(m.role_id == "w3" for m in out.metrics), 90,
                         "every group after the kill, and w3 up", worker, log)
        finally:
            stop_worker(worker, log)
        seen = [e.group_id for e in out.experiences]
        assert set(seen) == set(good)  # every group at least once, nothing lost
        assert seen.count("r1") == 1  # committed before w2 started: never redone
        print(f"killed -9 with {out_at_kill}/{len(good)} groups out; {len(seen) - len(set(seen))} redone after")
        assert len(out.dead) == 3  # the committed offsets kept the bad records from coming back
    finally:
        out.close()


SEND_TIMEOUT_S = 3  # the worker's producer gives up on a send after this (faust's PRODUCER_REQUEST_TIMEOUT)


def test_a_broker_restart_is_ridden_out_and_every_group_scored_once_committed(private_stack, namespace, tmp_path):
    """The broker dies with records in flight: the worker inside the role cannot deliver them and is
    replaced (again while the broker stays down), the role's process lives on, and once the broker
    is back the fresh worker redoes what was not committed. Later, SIGTERM stops it mid-stream and
    with the broker gone, each within its bound."""
    kafka = private_stack.kafka.model_copy(update={"partitions": 2})
    ensure_topics(kafka, run_topics(kafka, namespace, teams=("red",)))
    red = topic_name(namespace, "rollouts", "red")
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({
        "namespace": namespace, "output_dir": str(tmp_path / "out"), "model": {"path": "unused"},
        "stack": {"embedded": False}, "kafka": kafka.model_dump(), "explorer": {"team": "red"},
        "stream_ops": {"rewards": [{"name": "exact_match"}]},
    }))
    producer = make_producer(kafka)
    gids = [f"g-{i}" for i in range(6000)]
    for gid in gids:
        producer.produce(red, encode(make_group(gid, "red", ["4", "5"])), gid.encode())
    flush_or_raise(producer)
    del producer
    log = tmp_path / "worker.log"
    out = Outputs(kafka, namespace)
    try:
        worker = start_worker(config, "w1", log, env={"PRODUCER_REQUEST_TIMEOUT": str(SEND_TIMEOUT_S)})
        try:
            out.wait_for(lambda: len(out.experiences) >= 200, 60, "the first outputs", worker, log)
            private_stack.embedded.kill("tansu")  # records are in flight: their sends cannot be acknowledged
            killed = time.monotonic()
            deadline = killed + SEND_TIMEOUT_S + STOP_GRACE_S + 20
            while "the broker did not answer" not in log.read_text() and time.monotonic() < deadline:
                assert worker.poll() is None, f"the role exited {worker.returncode}:\n{log.read_text()[-3000:]}"
                time.sleep(0.5)
            took = time.monotonic() - killed
            assert "the broker did not answer" in log.read_text(), log.read_text()[-3000:]
            time.sleep(5)  # a few seconds more of outage: the fresh worker meets no broker either
            assert worker.poll() is None, f"the role exited {worker.returncode}:\n{log.read_text()[-3000:]}"
            outage = time.monotonic() - killed
            private_stack.embedded.restart("tansu")
            healed = time.monotonic()
            print(f"broker killed with {len(out.experiences)} groups out; worker replaced after {took:.1f}s; "
                  f"broker back after {outage:.1f}s")
            out.drain()
            n = len(out.experiences)
            out.wait_for(lambda: len(out.experiences) >= n + 300, 120, "scoring after the outage", worker, log)
            print(f"scoring again {time.monotonic() - healed:.1f}s after the broker came back")
            assert worker.poll() is None
            print(f"SIGTERM mid-stream: stopped in {stop_worker(worker, log):.1f}s, exit {worker.returncode}")
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait(10)
        worker = start_worker(config, "w3", log)
        try:
            out.wait_for(lambda: out.group_ids() >= set(gids) and any(m.role_id == "w3" for m in out.metrics), 120,
                         "every group, and w3 up", worker, log)
            ends = {e.partition: e.end for e in partition_ends(kafka, red)}
            deadline = time.monotonic() + 30
            while (committed := committed_offsets(kafka, f"{namespace}.stream-ops", red, list(ends))) != ends:
                assert time.monotonic() < deadline, f"committed {committed}, ends {ends}"
                time.sleep(0.5)
            private_stack.embedded.kill("tansu")  # SIGTERM must not hang on a broker that is gone
            print(f"SIGTERM with the broker down: stopped in {stop_worker(worker, log):.1f}s, exit {worker.returncode}")
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait(10)
        assert not out.dead
        print(f"{len(out.experiences) - len(gids)} groups redone after the broker death and the SIGTERM")
    finally:
        out.close()


def test_a_record_fetched_before_a_rebalance_is_never_acked_unprocessed(stack, namespace, tmp_path):
    """faust skips records fetched in an older consumer generation and acks them anyway, which
    lets the next commit pass records no agent has processed; the worker's consumer refuses those
    acks (the records are fetched again from the committed offset) and acks everything else."""
    from faust.types import TP, Message

    from streamrft.config import RunConfig
    from streamrft.stream_ops.app import make_app

    cfg = RunConfig.model_validate({"model": {"path": "unused"}, "namespace": namespace, "output_dir": str(tmp_path),
                                    "kafka": {"bootstrap": stack.kafka.bootstrap}})
    app = make_app(cfg, "w-generations")
    consumer = app.consumer
    topic = topic_name(namespace, "rollouts", "default")
    app.topics._acking_topics.add(topic)  # what the conductor does once the agent subscribes
    app.consumer_generation_id = 2

    def message(offset: int, generation: int, tracked: bool) -> Message:
        m = Message(topic, 0, offset, 0.0, 0, None, b"k", b"v", None, generation_id=generation)
        m.tracked = tracked
        return m

    assert consumer.ack(message(5, generation=1, tracked=False)) is False  # skipped by the stream
    assert consumer.ack(message(6, generation=1, tracked=True)) is True    # processed by the agent
    assert consumer.ack(message(7, generation=2, tracked=False)) is True   # this generation's
    assert sorted(consumer._acked[TP(topic, 0)]) == [6, 7]


def test_the_worker_fetches_with_kafka_fetch_wait_ms(stack, namespace, tmp_path):
    """faust makes its aiokafka consumer with a fetch wait of 1500 ms, which the embedded broker
    holds in full when nothing new is there; the worker's consumer fetches with kafka.fetch_wait_ms."""
    import asyncio

    from streamrft.config import RunConfig
    from streamrft.stream_ops.app import make_app

    cfg = RunConfig.model_validate({"model": {"path": "unused"}, "namespace": namespace, "output_dir": str(tmp_path),
                                    "kafka": {"bootstrap": stack.kafka.bootstrap, "fetch_wait_ms": 37}})
    app = make_app(cfg, "w-fetch-wait")

    async def started_fetcher_wait() -> int:
        kafka_consumer = app.consumer._thread._create_consumer(loop=asyncio.get_running_loop())
        await kafka_consumer.start()
        try:
            return kafka_consumer._fetcher._fetch_max_wait_ms
        finally:
            await kafka_consumer.stop()

    assert asyncio.run(started_fetcher_wait()) == 37


def test_records_the_broker_lists_late_are_all_scored(private_stack, namespace, tmp_path):
    """The broker writes to S3 through a proxy that holds half the PUTs back up to 0.2 s (a loaded
    S3 server) while 4 producers write small batches to one rollouts partition: it lists later
    batches before earlier ones (`benchmarks/offset_gaps.py`), and faust, meeting a later one,
    counts the offsets between as acked and commits past them, losing those groups. The worker's
    consumer waits for the late records (`infra.offset_gaps`): every group on the topic is scored."""
    import random
    import threading

    from streamrft.infra.chaos import DelayingS3Proxy

    es = private_stack.embedded
    proxy = DelayingS3Proxy(es.load_state().s3, max_delay_s=0.2, seed=2)
    es.kill("tansu")
    es.tansu_s3_endpoint = proxy.url
    es.restart("tansu")
    # a fetch that waits 500 ms (faust's own default is 1500) is answered with what is listed when
    # the wait ends, late batches skipped; at the demo's 100 ms it happens more rarely (measured with
    # gap_wait_s=0 here: 59 of 1459 groups never scored; with the guard, none)
    kafka = private_stack.kafka.model_copy(update={"partitions": 1, "fetch_wait_ms": 500})
    ensure_topics(kafka, run_topics(kafka, namespace, teams=("red",)))
    red = topic_name(namespace, "rollouts", "red")
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({
        "namespace": namespace, "output_dir": str(tmp_path / "out"), "model": {"path": "unused"},
        "stack": {"embedded": False}, "kafka": kafka.model_dump(), "explorer": {"team": "red"},
        "stream_ops": {"rewards": [{"name": "exact_match"}]},
    }))
    stop = threading.Event()

    def produce(index: int) -> None:
        rng, producer, n = random.Random(index), make_producer(kafka), 0
        while not stop.is_set():
            for _ in range(rng.randint(1, 4)):
                gid = f"p{index}-{n}"
                producer.produce(red, encode(make_group(gid, "red", ["4", "5"])), gid.encode())
                n += 1
            flush_or_raise(producer)
            time.sleep(rng.uniform(0, 0.03))

    def holes_met() -> int:
        return max((int(m.values.get("offset_holes_filled", 0)) for m in out.metrics if m.role == "stream_ops"),
                   default=0)

    log = tmp_path / "worker.log"
    out = Outputs(kafka, namespace)
    worker = start_worker(config, "w1", log)
    threads = [threading.Thread(target=produce, args=(i,), daemon=True) for i in range(4)]
    try:
        for t in threads:
            t.start()
        out.wait_for(lambda: len(out.experiences) >= 50, 60, "the first outputs", worker, log)
        out.wait_for(lambda: holes_met() >= 3, 120, "the worker to meet 3 holes", worker, log)
        stop.set()
        for t in threads:
            t.join(60)
        ends = {e.partition: e.end for e in partition_ends(kafka, red)}
        deadline = time.monotonic() + 60
        while (committed := committed_offsets(kafka, f"{namespace}.stream-ops", red, list(ends))) != ends:
            assert time.monotonic() < deadline, f"committed {committed}, ends {ends}\n{log.read_text()[-3000:]}"
            assert worker.poll() is None, f"worker exited {worker.returncode}\n{log.read_text()[-3000:]}"
            out.drain(0.5)
        stop_worker(worker, log)
    finally:
        stop.set()
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
        out.close()
    try:
        # read back whole, not live: a live reader of the outputs would skip late records itself
        on_topic = {decode(m.value(), RolloutGroup).group_id: m.offset() for m in read_all(kafka, red)}
        scored = {decode(m.value(), ExperienceGroup).group_id
                  for m in read_all(kafka, topic_name(namespace, "experiences"))}
        dead = read_all(kafka, topic_name(namespace, "dlq"))
    finally:
        proxy.close()
    missing = sorted((off, gid) for gid, off in on_topic.items() if gid not in scored)
    print(f"PUTs held back {proxy.delayed}; holes the worker met {holes_met()}; groups {len(on_topic)}, "
          f"scored {len(scored)}")
    assert not dead
    assert not missing, f"{len(missing)} groups on the topic never scored (offset, group): {missing[:20]}"
