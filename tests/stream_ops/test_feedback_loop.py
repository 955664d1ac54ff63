"""Rewards that arrive later, on the real embedded stack: a stream-ops worker parks the groups of a
run with a `feedback` term, the feedback join (`streamrft join`) scores them when their ratings
are in.

Ratings before and after their group, copies of one rating, ratings from a team not allowed, a
rating of an id nobody parked, one that does not decode, and a group nobody rates (timed out and
dropped). Then the join killed -9 while groups are parked: after its restart each group comes out
once, those joined before the kill never again.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from streamrft.infra.kafka import ensure_topics, flush_or_raise, make_consumer, make_producer, run_topics
from streamrft.schemas import Feedback, RolloutGroup, Task, Trajectory, decode, encode, topic_name

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 15.0


def make_group(gid: str, team: str = "red", n: int = 2, answer: str = "") -> RolloutGroup:
    task = Task(task_id=f"task-{gid}", prompt="rate me", answer=answer)
    trajs = [Trajectory(traj_id=f"{gid}-{i}", group_id=gid, task_id=task.task_id, team=team, model_version=0,
                        prompt_ids=[1, 2], response_ids=[3 + i], logprobs=[-0.1], response_text=f"answer {i}")
             for i in range(n)]
    return RolloutGroup(group_id=gid, team=team, task=task, trajectories=trajs)


def rating(target_id: str, reward: float | None = None, label: str | None = None, **kw) -> Feedback:
    return Feedback(target="trajectory", target_id=target_id, reward=reward, label=label, source="human",
                    rater=kw.pop("rater", "ann"), **kw)


class Bus:
    """Produces rollouts and ratings; reads every output topic of the namespace from the start."""

    def __init__(self, kafka, ns: str):
        self.kafka, self.ns = kafka, ns
        self.producer = make_producer(kafka)
        self.consumer = make_consumer(kafka, None)
        tps = [TopicPartition(topic_name(ns, "experiences"), p, OFFSET_BEGINNING) for p in range(kafka.partitions)]
        tps += [TopicPartition(topic_name(ns, r), 0, OFFSET_BEGINNING) for r in ("dlq", "metrics", "admission")]
        self.consumer.assign(tps)
        self.out: dict[str, list] = {"experience_group": [], "dead_letter": [], "metric": [], "group_dropped": [],
                                     "explorer_ledger": []}

    def rollout(self, group: RolloutGroup) -> None:
        self.producer.produce(topic_name(self.ns, "rollouts", group.team), encode(group), group.group_id.encode())
        flush_or_raise(self.producer)

    def rate(self, *ratings: Feedback, team: str = "red", raw: bytes | None = None) -> None:
        topic = topic_name(self.ns, "feedback", team)
        for f in ratings:
            self.producer.produce(topic, encode(f), (f.target_id or "pair").encode())
        if raw is not None:
            self.producer.produce(topic, raw, b"raw")
        flush_or_raise(self.producer)

    def read(self, timeout: float = 0.5) -> None:
        for m in self.consumer.consume(num_messages=1000, timeout=timeout):
            assert m.error() is None, m.error()
            msg = decode(m.value())
            self.out[msg.kind].append(msg)

    def experiences(self) -> dict[str, list]:
        got: dict[str, list] = {}
        for e in self.out["experience_group"]:
            got.setdefault(e.group_id, []).append(e)
        return got

    def last_metric(self, role: str) -> dict[str, float]:
        values = [m.values for m in self.out["metric"] if m.role == role]
        return values[-1] if values else {}

    def wait_for(self, done, timeout: float, what: str, procs: dict) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            for name, (p, log) in procs.items():
                assert p.poll() is None, f"{name} exited with {p.returncode}:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}; " + "; ".join(
                f"{name} log:\n{log.read_text()[-2000:]}" for name, (_, log) in procs.items())
            self.read()

    def close(self) -> None:
        self.consumer.close()


def start(args: list[str], log: Path) -> tuple[subprocess.Popen, Path]:
    with open(log, "ab") as fh:
        return subprocess.Popen([sys.executable, "-m", "streamrft.cli", *args], stdout=fh, stderr=subprocess.STDOUT,
                                cwd=ROOT, env=dict(os.environ)), log


def stop(procs: dict) -> None:
    for p, _ in procs.values():
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p, _ in procs.values():
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)


def start_run(kafka, namespace: str, tmp_path: Path, params: dict, rewards: list | None = None):
    ensure_topics(kafka, run_topics(kafka, namespace, teams=("red", "blue")))
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({
        "namespace": namespace, "output_dir": str(tmp_path / "out"), "model": {"path": "unused"},
        "stack": {"embedded": False}, "kafka": kafka.model_dump(),
        "stream_ops": {"rewards": [{"name": "feedback", "params": params}, *(rewards or [])],
                       "drop_zero_variance": True, "priority": "reward_std"},
        "algorithm": {"advantage": {"type": "dr_grpo"}}, "eval": {"rewards": [{"name": "exact_match"}]},
    }))
    bus = Bus(kafka, namespace)
    procs = {"stream-ops": start(["score", str(config)], tmp_path / "score.log"),
             "join": start(["join", str(config)], tmp_path / "join.log")}
    return bus, procs, config


@pytest.fixture
def feedback_run(stack, namespace, tmp_path):
    kafka = stack.kafka.model_copy(update={"partitions": 2})
    bus, procs, config = start_run(kafka, namespace, tmp_path, {
        "min_rated": 2, "wait_s": WAIT_S, "on_timeout": "drop", "labels": {"good": 1.0, "bad": 0.0}})
    yield bus, procs, config, tmp_path
    stop(procs)
    bus.close()


def test_ratings_in_any_order_become_each_groups_reward_once(feedback_run):
    bus, procs, _, _ = feedback_run
    # rated before its rollout exists: waits for it
    bus.rate(rating("early-0", 1.0), rating("early-0", 1.0), rating("early-1", 0.0), rating("early-1", 0.0))
    for gid in ("early", "later", "teams", "nobody"):
        bus.rollout(make_group(gid))
    bus.wait_for(lambda: bus.last_metric("feedback_join").get("parked", 0) >= 3, 90, "the groups parked", procs)
    # rated after it was parked: a label and a reward average; one rating sent twice counts once
    twice = rating("later-1", 1.0)
    bus.rate(rating("later-0", label="good"), rating("later-0", 0.5), twice, twice, rating("later-1", 0.0),
             rating("nobody-0", label="meh"))  # a label outside the set: counted, not applied
    # another team's ratings do not count for red's group (teams: not set); red's own do
    bus.rate(rating("teams-1", 1.0), rating("teams-1", 1.0), team="blue")
    bus.rate(rating("teams-0", 1.0), rating("teams-0", 1.0), rating("teams-1", 0.0), rating("teams-1", 0.0))
    # a rating of an id nobody parked, and bytes that are no rating at all
    bus.rate(rating("ghost-0", 1.0), raw=b"\x00not a rating")
    bus.wait_for(lambda: {"early", "later", "teams"} <= set(bus.experiences()), 60, "the rated groups", procs)
    bus.rate(rating("early-1", 1.0))  # its group was joined already: late, never applied

    def settled() -> bool:
        m = bus.last_metric("feedback_join")
        return m.get("timed_out", 0) >= 1 and m.get("ratings_unknown", 0) >= 1 and m.get("ratings_late", 0) >= 1
    bus.wait_for(settled, WAIT_S + 60, "the timeout, the unknown and the late rating counted", procs)

    got = bus.experiences()
    assert {gid: len(es) for gid, es in got.items()} == {"early": 1, "later": 1, "teams": 1}
    expected = {"early": [1.0, 0.0], "later": [0.75, 0.5], "teams": [1.0, 0.0]}
    for gid, rewards in expected.items():
        e = got[gid][0]
        assert e.rewards == pytest.approx(rewards) and e.reward_components == {"feedback": pytest.approx(rewards)}
        mean = sum(rewards) / 2
        assert e.advantages == pytest.approx([r - mean for r in rewards])  # dr_grpo: less the group's mean
        assert e.source_topic == topic_name(bus.ns, "rollouts", "red")
    drops = {d.group_id: d.reason for d in bus.out["group_dropped"]}
    assert drops == {"nobody": "feedback_timeout"}
    dead = [d for d in bus.out["dead_letter"] if d.role == "feedback_join"]
    assert len(dead) == 1 and dead[0].value == b"\x00not a rating"
    assert dead[0].source_topic == topic_name(bus.ns, "feedback", "red") and dead[0].source_offset >= 0
    m = bus.last_metric("feedback_join")
    assert m["joined"] == 3 and m["timed_out"] == 1 and m["timed_out_share"] == pytest.approx(0.25)
    assert m["ratings_duplicate"] == 1 and m["ratings_unknown_label"] == 1 and m["ratings_wrong_team"] == 2
    assert m["ratings_from_human"] == 4 + 4 + 4  # applied: early's 4, later's 4 distinct, teams' 4 red
    assert m["parked"] == 0
    assert bus.last_metric("stream_ops")["parked"] == 4


def test_a_join_killed_with_groups_parked_scores_each_once_after_its_restart(feedback_run):
    """50 groups parked, 25 of them rated and joined; then the join and the stream-ops worker are
    killed -9, the other 25 rated while they are down, both started again: each of the 50 comes out
    once (the worker may park a group again: it was not committed; the join ignores the copy)."""
    bus, procs, config, tmp_path = feedback_run
    groups = [f"g{i:02d}" for i in range(50)]
    for gid in groups:
        bus.rollout(make_group(gid))
    first, second = groups[:25], groups[25:]
    bus.rate(*[rating(f"{gid}-{i}", float(i)) for gid in first for i in (0, 1) for _ in range(2)])
    bus.wait_for(lambda: set(first) <= set(bus.experiences()), 120, "the first half joined", procs)
    bus.wait_for(lambda: bus.last_metric("feedback_join").get("parked", 0) == len(second), 30,
                 "the second half parked", procs)
    for name in ("join", "stream-ops"):  # -9, with 25 groups parked and the first 25 tombstoned
        procs[name][0].kill()
        procs[name][0].wait(10)
    bus.rate(*[rating(f"{gid}-{i}", float(i)) for gid in second for i in (0, 1) for _ in range(2)])
    procs["stream-ops"] = start(["score", str(config)], tmp_path / "score-2.log")
    procs["join"] = start(["join", str(config)], tmp_path / "join-2.log")
    bus.wait_for(lambda: set(groups) <= set(bus.experiences()), 120, "the second half joined after the restart",
                 procs)
    time.sleep(3)
    bus.read()
    got = bus.experiences()
    assert {gid: len(es) for gid, es in got.items()} == {gid: 1 for gid in groups}
    assert all(e.rewards == [0.0, 1.0] for es in got.values() for e in es)


@pytest.mark.parametrize("on_timeout", ["dead_letter", "fallback"])
def test_a_group_nobody_rates_is_dead_lettered_or_scored_by_its_fallback_term(stack, namespace, tmp_path, on_timeout):
    kafka = stack.kafka.model_copy(update={"partitions": 2})
    fallback = {"fallback_term": "exact_match"} if on_timeout == "fallback" else {}
    bus, procs, _ = start_run(kafka, namespace, tmp_path, {"wait_s": 5.0, "on_timeout": on_timeout, **fallback},
                              rewards=[{"name": "exact_match", "weight": 0.0}])
    try:
        group = make_group("silent", answer="answer 1")
        bus.rollout(group)
        if on_timeout == "dead_letter":
            bus.wait_for(lambda: bus.out["dead_letter"], 90, "the dead letter", procs)
            dead = bus.out["dead_letter"][0]
            assert dead.error_type == "FeedbackTimeout" and "wait_s=5 s" in dead.reason
            assert decode(dead.value, RolloutGroup) == group  # the whole group, to replay
            assert (dead.source_topic, dead.source_offset) == (topic_name(namespace, "rollouts", "red"), 0)
            bus.wait_for(lambda: bus.out["group_dropped"], 30, "its drop announced", procs)
            assert [(d.group_id, d.reason) for d in bus.out["group_dropped"]] == [("silent", "dead_letter")]
        else:  # exact_match (weight 0 in the mix) stands in for the ratings: 0 and 1
            bus.wait_for(lambda: bus.out["experience_group"], 90, "the fallback's experience", procs)
            e = bus.out["experience_group"][0]
            assert e.reward_components == {"feedback": [0.0, 1.0], "exact_match": [0.0, 1.0]} and e.rewards == [0.0, 1.0]
            bus.wait_for(lambda: bus.last_metric("feedback_join").get("out_fallback", 0) == 1, 30, "counted", procs)
        bus.wait_for(lambda: bus.last_metric("feedback_join").get("timed_out") == 1, 30, "the timeout counted", procs)
    finally:
        stop(procs)
        bus.close()
