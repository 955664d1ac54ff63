"""Fixtures for trainer tests on the real stack: the CPU demo config with a tiny locally built
model (no warm-up stages) in a namespace of the test's own, and ExperienceGroups to feed it."""
from __future__ import annotations

import json
import threading
from collections import Counter
from pathlib import Path

import pytest

from streamrft.infra.kafka import ensure_topics, flush_or_raise, make_producer, run_topics
from streamrft.schemas import ExperienceGroup, Task, Trajectory, encode, topic_name
from tests_helpers import demo_overrides

DEMO = Path(__file__).resolve().parents[2] / "examples" / "cpu_demo.yaml"


def experience_group(gid: str, version: int, n: int = 4) -> ExperienceGroup:
    """A scored group of `n` trajectories of one "rev ab=" task, ids `<gid>-<i>`."""
    task = Task(prompt="rev ab=", answer="ba")
    trajs = [Trajectory(traj_id=f"{gid}-{i}", group_id=gid, task_id=task.task_id, model_version=version,
                        prompt_ids=[1, 7, 4, 5, 6, 15], response_ids=[5, 4, 2], logprobs=[-0.7, -0.9, -0.2])
             for i in range(n)]
    rewards = [1.0, 0.0, 0.5, 0.5, 1.0, 0.0, 0.5, 0.5][:n]
    return ExperienceGroup(group_id=gid, task=task, trajectories=trajs, rewards=rewards,
                           advantages=[r - sum(rewards) / n for r in rewards])


@pytest.fixture
def trainer_config(namespace, tmp_path):
    """`make(stack, *overrides)`: a resolved trainer config on `stack`, its topics created."""

    def make(stack, *extra: str):
        from streamrft.config import load_config
        from streamrft.launch.prepare import prepare

        cfg = load_config(DEMO, demo_overrides(stack, tmp_path, [f"namespace={namespace}", "stages=[]",
                                                                 "explorer.num_explorers=1", *extra]))
        ensure_topics(stack.kafka, run_topics(stack.kafka, namespace))
        return prepare(cfg)

    return make


def produce_groups(kafka, namespace: str, groups: list[ExperienceGroup]) -> None:
    """Into one partition (one key), so the trainer reads them in this order."""
    producer = make_producer(kafka)
    for g in groups:
        producer.produce(topic_name(namespace, "experiences"), key=b"one-partition", value=encode(g))
    flush_or_raise(producer)


def run_trainer(cfg, timeout_s: float = 180.0, trainer=None) -> dict:
    """`Trainer(cfg).run()`, stopped after `timeout_s` so that a test never hangs on it."""
    from streamrft.consumers.trainer import Trainer

    if trainer is None:
        trainer = Trainer(cfg)
    timer = threading.Timer(timeout_s, trainer.stop.set)
    timer.start()
    try:
        return trainer.run()
    finally:
        timer.cancel()


def audit_counts(ckpt_dir: Path) -> Counter:
    """How many times each trajectory id appears over the audit trail."""
    return Counter(i for f in (ckpt_dir / "audit").glob("v*.json") for i in json.loads(f.read_text()))


def partitions_of(kafka, topic: str) -> set[int]:
    """The partitions of `topic` that hold records."""
    from streamrft.infra.kafka import partition_ends

    return {e.partition for e in partition_ends(kafka, topic) if e.end > e.start}


@pytest.fixture
def kit():
    """The helpers above, for test modules (conftest modules are not importable by name)."""

    class Kit:
        group = staticmethod(experience_group)
        produce = staticmethod(produce_groups)
        run = staticmethod(run_trainer)
        audit = staticmethod(audit_counts)
        partitions_of = staticmethod(partitions_of)

    return Kit
