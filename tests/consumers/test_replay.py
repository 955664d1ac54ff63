"""Offline training by replaying a retained experiences topic: `streamrft replay` trains every
trajectory of the log exactly once (a re-delivered group included), ignores the staleness rule,
and stops by itself at the log's end."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import msgpack

from streamrft.infra.kafka import ensure_topics, flush_or_raise, make_producer, run_topics
from streamrft.schemas import ExperienceGroup, Task, Trajectory, encode, topic_name
from tests_helpers import demo_overrides, read_tensorboard

ROOT = Path(__file__).resolve().parents[2]


def _group(i: int, version: int) -> ExperienceGroup:
    task = Task(prompt="rev ab=", answer="ba")
    gid = f"g{i}"
    trajs = [Trajectory(group_id=gid, task_id=task.task_id, model_version=version, prompt_ids=[1, 7, 4, 5, 6, 15],
                        response_ids=[5, 4, 2], logprobs=[-0.7, -0.9, -0.2]) for _ in range(4)]
    return ExperienceGroup(group_id=gid, task=task, trajectories=trajs, rewards=[1.0, 0.0, 0.5, 0.5],
                           advantages=[1.2, -1.2, 0.0, 0.0])


def test_replay_trains_the_whole_log_once_and_stops_at_its_end(stack, namespace, tmp_path):
    source = f"{namespace}-src"
    ensure_topics(stack.kafka, run_topics(stack.kafka, source))
    groups = [_group(i, version=50 + i) for i in range(10)]  # versions far ahead of a fresh trainer
    producer = make_producer(stack.kafka)
    for g in groups + groups[:2]:  # two groups delivered twice, as stream ops may after a crash
        producer.produce(topic_name(source, "experiences"), key=g.group_id.encode(), value=encode(g))
    flush_or_raise(producer)

    overrides = demo_overrides(stack, tmp_path, [f"namespace={namespace}", "trainer.batch_groups=4",
                                                 "trainer.max_steps=100", "stages=[]"])
    res = subprocess.run([sys.executable, "-m", "streamrft.cli", "replay", "--source", source,
                          str(ROOT / "examples" / "cpu_demo.yaml"), *overrides],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    ckpt = tmp_path / "trainer"
    state = json.loads((ckpt / (ckpt / "LATEST").read_text().strip() / "state.json").read_text())
    assert state["counts"]["trained"] == 40 and state["counts"]["duplicate"] == 8 and state["counts"]["stale"] == 0
    assert state["step"] == 3 and state["version"] == 3  # 4 + 4 + the last 2 groups, then the end
    logged = read_tensorboard(tmp_path / "tensorboard")  # the replaying trainer's own monitor.backends
    assert [step for step, _ in logged["trainer/reward_mean"]] == [1, 2, 3]
    assert logged["trainer/count_trained"][-1] == (3, 40.0)
    audit = [i for f in (ckpt / "audit").glob("v*.json") for i in json.loads(f.read_text())]
    assert sorted(audit) == sorted(t.traj_id for g in groups for t in g.trajectories)


def test_groups_the_model_cannot_take_become_dead_letters_not_crashes(stack, namespace, tmp_path):
    from streamrft.infra.kafka import make_consumer
    from confluent_kafka import TopicPartition
    from streamrft.schemas import DeadLetter, decode

    source = f"{namespace}-src"
    ensure_topics(stack.kafka, run_topics(stack.kafka, source))
    ensure_topics(stack.kafka, run_topics(stack.kafka, namespace))
    bad_vocab = _group(0, 0)
    bad_vocab.trajectories[1].response_ids = [5, 999, 2]
    bad_adv = _group(1, 0)
    bad_adv.advantages[0] = float("nan")
    producer = make_producer(stack.kafka)
    for g in (bad_vocab, bad_adv, _group(2, 0)):
        producer.produce(topic_name(source, "experiences"), key=g.group_id.encode(), value=encode(g))
    flush_or_raise(producer)
    overrides = demo_overrides(stack, tmp_path, [f"namespace={namespace}", "trainer.batch_groups=4", "stages=[]"])
    res = subprocess.run([sys.executable, "-m", "streamrft.cli", "replay", "--source", source,
                          str(ROOT / "examples" / "cpu_demo.yaml"), *overrides],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    ckpt = tmp_path / "trainer"
    state = json.loads((ckpt / (ckpt / "LATEST").read_text().strip() / "state.json").read_text())
    assert state["counts"]["dead_lettered"] == 2 and state["counts"]["trained"] == 4
    consumer = make_consumer(stack.kafka, None)
    consumer.assign([TopicPartition(topic_name(namespace, "dlq"), 0, 0)])
    dead = []
    for _ in range(20):
        dead += [decode(m.value(), DeadLetter) for m in consumer.consume(10, timeout=0.5) if m.error() is None]
        if len(dead) == 2:
            break
    consumer.close()
    reasons = sorted(d.reason for d in dead)
    assert "finite" in reasons[0] and "vocabulary size" in reasons[1]  # NaN: refused by decode itself
    assert len({(d.source_partition, d.source_offset) for d in dead}) == 2
    assert all(d.source_topic == topic_name(source, "experiences") and d.source_offset >= 0 for d in dead)
    # the original bytes kept (raw msgpack: a NaN advantage does not decode)
    assert {msgpack.unpackb(d.value)["group_id"] for d in dead} == {"g0", "g1"}
