"""`streamrft replay` by range: per-partition offsets of an experiences topic, and a time range of a
rollouts topic scored again with the replaying config's rewards; exactly the records in the range
are trained (the audit trail's ids), a rollout group the scorer filters (zero variance) is skipped."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from streamrft.infra.kafka import ensure_topics, flush_or_raise, make_producer, run_topics
from streamrft.schemas import RolloutGroup, Task, Trajectory, encode, topic_name
from tests_helpers import demo_overrides

ROOT = Path(__file__).resolve().parents[2]


def _replay(stack, namespace, tmp_path, source, *flags):
    overrides = demo_overrides(stack, tmp_path, [f"namespace={namespace}", "trainer.batch_groups=2",
                                                 "trainer.max_steps=100", "stages=[]"])
    res = subprocess.run([sys.executable, "-m", "streamrft.cli", "replay", "--source", source, *flags,
                          str(ROOT / "examples" / "cpu_demo.yaml"), *overrides],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    return res


def test_replay_of_an_offset_range_trains_exactly_the_records_in_it(stack, namespace, tmp_path, kit):
    source = f"{namespace}-src"
    ensure_topics(stack.kafka, run_topics(stack.kafka, source))
    groups = [kit.group(f"g{i}", version=50 + i) for i in range(8)]
    kit.produce(stack.kafka, source, groups)  # one partition, offsets 0..7
    partition = next(iter(kit.partitions_of(stack.kafka, topic_name(source, "experiences"))))
    _replay(stack, namespace, tmp_path, source, "--range", f"{partition}:3-6")
    audit = kit.audit(tmp_path / "trainer")
    assert sorted(audit) == sorted(f"g{i}-{j}" for i in (3, 4, 5) for j in range(4)) and max(audit.values()) == 1


def _rollout_group(gid: str, answers: list[str]) -> RolloutGroup:
    task = Task(prompt="rev ab=", answer="ba")
    trajs = [Trajectory(traj_id=f"{gid}-{i}", group_id=gid, task_id=task.task_id, model_version=0,
                        prompt_ids=[1, 7, 4, 5, 6, 15], response_ids=[5, 4, 2], logprobs=[-0.7, -0.9, -0.2],
                        response_text=text) for i, text in enumerate(answers)]
    return RolloutGroup(group_id=gid, task=task, trajectories=trajs)


def test_replay_of_a_time_range_of_rollouts_scores_them_again(stack, namespace, tmp_path, kit):
    source = f"{namespace}-src"
    ensure_topics(stack.kafka, run_topics(stack.kafka, source))
    topic = topic_name(source, "rollouts", "default")
    producer = make_producer(stack.kafka)
    mixed, same = ["ba", "b", "ab", "ba"], ["ba"] * 4  # `same` scores alike: filtered as zero variance
    for g in (_rollout_group("r0", mixed), _rollout_group("r1", same), _rollout_group("r2", mixed)):
        producer.produce(topic, key=b"one-partition", value=encode(g))
    flush_or_raise(producer)
    time.sleep(1.5)
    until = int(time.time() * 1000)
    producer.produce(topic, key=b"one-partition", value=encode(_rollout_group("r3", mixed)))  # after the range
    flush_or_raise(producer)
    _replay(stack, namespace, tmp_path, source, "--rollouts", "default", "--to-timestamp-ms", str(until))
    audit = kit.audit(tmp_path / "trainer")
    assert sorted(audit) == sorted(f"r{g}-{j}" for g in (0, 2) for j in range(4))
