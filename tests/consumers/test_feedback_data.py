"""Offline data from ratings (`streamrft replay --feedback`): DPO pairs and KTO labels by hand, then
the command on the real stack, from a feedback topic and the rollouts it names to a trained DPO model."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from streamrft.consumers.feedback_data import feedback_rows
from streamrft.schemas import Feedback, RolloutGroup, Task, Trajectory

ROOT = Path(__file__).resolve().parents[2]


def group(gid: str, prompt: str, texts: list[str], team: str = "red") -> RolloutGroup:
    task = Task(task_id=f"task-{gid}", prompt=prompt, answer="")
    return RolloutGroup(group_id=gid, team=team, task=task, trajectories=[
        Trajectory(traj_id=f"{gid}-{i}", group_id=gid, task_id=task.task_id, team=team, model_version=0,
                   prompt_ids=[1], response_ids=[2], logprobs=[-0.5], response_text=text,
                   info={"completion_ids": [f"c-{gid}-{i}"]})
        for i, text in enumerate(texts)])


def rate(target_id=None, reward=None, label=None, preference=None, fid=None) -> Feedback:
    extra = {"feedback_id": fid} if fid else {}
    return Feedback(target="trajectory", target_id=target_id, reward=reward, label=label, preference=preference,
                    source="human", rater="ann", **extra)


GROUPS = [group("a", "rev abc=", ["cba", "abc", "bca"]), group("b", "rev xy=", ["yx", "xy"])]
RATINGS = [
    rate(preference={"chosen": "a-0", "rejected": "a-1"}),
    rate("a-0", 1.0), rate("a-0", 0.8), rate("c-a-2", 0.2),  # a gateway completion's id names a-2
    rate("b-0", label="good"), rate("b-1", label="bad"),
    rate("b-1", label="meh"),  # not a configured label
    rate("ghost", 1.0),  # names nothing
    rate("a-2", 0.0, fid="same"), rate("a-2", 0.0, fid="same"),  # one rating sent twice
]


def test_dpo_rows_are_the_preferences_and_each_prompts_best_against_its_worst():
    out = feedback_rows(GROUPS, RATINGS, "dpo", labels={"good": 1.0, "bad": 0.0})
    # a: means a-0 0.9, a-2 0.1 (0.2 and 0.0); b: b-0 1.0, b-1 0.0
    assert out.rows == [{"prompt": "rev abc=", "chosen": "cba", "rejected": "abc"},
                        {"prompt": "rev abc=", "chosen": "cba", "rejected": "bca"},
                        {"prompt": "rev xy=", "chosen": "yx", "rejected": "xy"}]
    assert out.counts == {"unknown": 1, "unknown_label": 1, "duplicate": 1, "rows": 3, "ratings": 9}


def test_kto_labels_are_the_mean_rating_against_the_threshold_and_preferences_fill_in():
    out = feedback_rows(GROUPS, RATINGS, "kto", labels={"good": 1.0, "bad": 0.0}, threshold=0.5)
    assert out.rows == [{"prompt": "rev abc=", "completion": "cba", "label": True},
                        {"prompt": "rev abc=", "completion": "bca", "label": False},
                        {"prompt": "rev xy=", "completion": "yx", "label": True},
                        {"prompt": "rev xy=", "completion": "xy", "label": False},
                        {"prompt": "rev abc=", "completion": "abc", "label": False}]  # rejected in a preference
    with pytest.raises(ValueError, match="shape 'sft' is not one of"):
        feedback_rows(GROUPS, RATINGS, "sft")


def test_replay_feedback_trains_dpo_on_a_preference_pair_from_the_topics(stack, namespace, tmp_path):
    from streamrft.infra.kafka import ensure_topics, flush_or_raise, make_producer, run_topics
    from streamrft.schemas import encode, topic_name

    ensure_topics(stack.kafka, run_topics(stack.kafka, namespace, teams=("red",)))
    producer = make_producer(stack.kafka)
    for g in GROUPS:
        producer.produce(topic_name(namespace, "rollouts", "red"), encode(g), g.group_id.encode())
    for f in RATINGS[:1] + [rate("a-1", 0.3)]:  # the preference a-0 over a-1, and a rating of a-1 alone
        producer.produce(topic_name(namespace, "feedback", "red"), encode(f), b"k")
    flush_or_raise(producer)
    config = tmp_path / "dpo.yaml"
    config.write_text(yaml.safe_dump({
        "namespace": f"{namespace}-dpo", "output_dir": str(tmp_path / "out"), "stack": {"embedded": False},
        "kafka": stack.kafka.model_dump(), "s3": stack.s3.model_dump(),
        "model": {"path": str(tmp_path / "tiny"), "build": {"hidden_size": 32, "layers": 1, "heads": 2}},
        "trainer": {"micro_batch_size": 2, "max_steps": 3, "lr": 1e-3}, "algorithm": {"type": "dpo"}}))
    r = subprocess.run([sys.executable, "-m", "streamrft.cli", "replay", "--source", namespace, "--feedback", "red",
                        str(config)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "out" / "feedback-dpo.jsonl").read_text().splitlines()]
    assert rows == [{"prompt": "rev abc=", "chosen": "cba", "rejected": "abc"}]  # one group's one scalar: no pair
    assert "1 dpo rows from 2 ratings" in r.stdout and "dpo done: 3 steps" in r.stdout
