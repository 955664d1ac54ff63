"""The difficulty selector on the real stack: an explorer reads per-task outcomes from the task-stats
topic and samples the learnable tasks far more often than the trivial and impossible ones.

The outcomes are published beforehand as stream ops would (16 episodes per task: trivial ones all
solved, impossible ones never, learnable ones half the time); one explorer with the tiny demo model
then runs without trainer or stream ops, and the groups it publishes on the rollouts topic are
counted by task kind. Expected share of learnable tasks: 8 x 0.25 / (8 x 0.25 + 16 x 0.01) = 0.93.
"""
from __future__ import annotations

import json
import threading
from collections import Counter
from pathlib import Path

import pytest

from streamrft.config import load_config
from streamrft.infra.kafka import ensure_topics, flush_or_raise, make_producer, run_topics
from streamrft.schemas import RolloutGroup, TaskOutcome, decode, encode, topic_name
from tests_helpers import demo_overrides, read_all

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "cpu_demo.yaml"
SOLVED = {"trivial": [1.0] * 8, "impossible": [0.0] * 8, "learnable": [1.0, 0.0] * 4}
GROUPS = 48

pytestmark = pytest.mark.slow


def test_an_explorer_reading_task_stats_samples_the_learnable_tasks(stack, namespace, tmp_path):
    from streamrft.launch.prepare import prepare
    from streamrft.producers.explorer import Explorer

    tasks = tmp_path / "mixed.jsonl"
    kinds = {f"{kind}-{i}": kind for kind in SOLVED for i in range(8)}
    tasks.write_text("".join(json.dumps({"task_id": tid, "prompt": "rev ab=", "answer": "ba"}) + "\n" for tid in kinds))
    cfg = prepare(load_config(DEMO, demo_overrides(stack, tmp_path, [
        f"namespace={namespace}", f"data.train={tasks}", "eval.every_versions=0", "explorer.num_explorers=1",
        f"explorer.max_groups={GROUPS}", "trainer.max_staleness=100",  # no trainer: admission must not wait for one
        "explorer.task_selector={type: difficulty, params: {min_attempts: 16, skip_weight: 0.01}}"])))
    ensure_topics(cfg.kafka, run_topics(cfg.kafka, namespace, cfg.teams))
    producer = make_producer(cfg.kafka)
    for tid, kind in kinds.items():
        for g in range(2):
            o = TaskOutcome(group_id=f"{tid}-g{g}", task_id=tid, rewards=SOLVED[kind])
            producer.produce(topic_name(namespace, "task-stats"), key=o.group_id.encode(), value=encode(o))
    flush_or_raise(producer)

    explorer = Explorer(cfg, 0)
    stats: dict = {}
    thread = threading.Thread(target=lambda: stats.update(explorer.run()), daemon=True)
    thread.start()
    thread.join(timeout=300)
    if thread.is_alive():
        explorer.stop.set()
        thread.join(60)
        pytest.fail(f"the explorer did not publish {GROUPS} groups within 300 s")
    assert stats["groups"] >= GROUPS

    groups = [decode(m.value(), RolloutGroup) for m in read_all(cfg.kafka, topic_name(namespace, "rollouts", "default"))]
    got = Counter(kinds[g.task.task_id] for g in groups)
    print(f"groups by kind: {dict(got)}")
    assert sum(got.values()) == stats["groups"]
    assert got["learnable"] >= 0.75 * len(groups), got   # uniform sampling would give a third
    assert got["trivial"] + got["impossible"] <= 0.25 * len(groups), got
