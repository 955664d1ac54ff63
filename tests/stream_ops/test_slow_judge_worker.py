"""A slow judge on the real stack: one real stream-ops worker (a subprocess) scores with the `judge`
term over HTTP (`tests/judge_server.py`); one group's judge call hangs. While it hangs, every other
group (before and after it in the same partition) is scored and put out, and the offsets before it
are committed; after its timeout it is dead-lettered with the reason and the commit reaches the end.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml
from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from judge_server import judge_server
from streamrft.infra.kafka import committed_offsets, ensure_topics, flush_or_raise, make_consumer, make_producer, run_topics
from streamrft.schemas import RolloutGroup, Task, Trajectory, decode, encode, topic_name

REPO = Path(__file__).resolve().parents[2]
TEAM = "judged"
TIMEOUT_S = 30.0  # wide: the quick groups and the commit before the slow one must come out within it
BEFORE, AFTER = 5, 20


def make_group(gid: str, responses: list[str]) -> RolloutGroup:
    task = Task(task_id=f"t-{gid}", prompt="2+2=", answer="4")
    trajs = [Trajectory(traj_id=f"{gid}-{i}", group_id=gid, task_id=task.task_id, team=TEAM, model_version=0,
                        prompt_ids=[1], response_ids=[2], logprobs=[-0.1], response_text=r)
             for i, r in enumerate(responses)]
    return RolloutGroup(group_id=gid, team=TEAM, task=task, trajectories=trajs)


def test_a_slow_judge_holds_up_no_other_record_nor_earlier_commits(stack, namespace, tmp_path):
    kafka = stack.kafka.model_copy(update={"partitions": 1})
    ensure_topics(kafka, run_topics(kafka, namespace, teams=(TEAM,)))
    topic = topic_name(namespace, "rollouts", TEAM)
    quick = [f"q{i}" for i in range(BEFORE + AFTER)]
    with judge_server(slow_s=600) as (url, state):
        config = tmp_path / "run.yaml"
        config.write_text(yaml.safe_dump({
            "namespace": namespace, "output_dir": str(tmp_path / "out"), "model": {"path": "unused"},
            "stack": {"embedded": False}, "kafka": kafka.model_dump(), "explorer": {"team": TEAM},
            "stream_ops": {"rewards": [{"name": "judge", "timeout_s": TIMEOUT_S, "retries": 0,
                                        "params": {"backend": "http", "base_url": url, "model": "judge"}}]},
        }))
        producer = make_producer(kafka)
        for gid in quick[:BEFORE] + ["slow"] + quick[BEFORE:]:
            responses = ["4", "SLOW"] if gid == "slow" else ["4", "5"]
            producer.produce(topic, encode(make_group(gid, responses)), gid.encode(), partition=0)
        flush_or_raise(producer)
        del producer

        log = tmp_path / "worker.log"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        with open(log, "ab") as fh:
            worker = subprocess.Popen([sys.executable, "-m", "streamrft.stream_ops.cli_entry", str(config),
                                       "--worker-id", "judged"], stdout=fh, stderr=subprocess.STDOUT, cwd=REPO, env=env)
        consumer = make_consumer(kafka, None)
        consumer.assign([TopicPartition(topic_name(namespace, "experiences"), 0, OFFSET_BEGINNING),
                         TopicPartition(topic_name(namespace, "dlq"), 0, OFFSET_BEGINNING)])
        out: dict[str, list] = {"experience_group": [], "dead_letter": []}
        group = f"{namespace}.stream-ops"

        def read_until(done, timeout: float, what: str) -> None:
            deadline = time.monotonic() + timeout
            while not done():
                assert worker.poll() is None, f"worker exited {worker.returncode}:\n{log.read_text()[-3000:]}"
                assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{log.read_text()[-3000:]}"
                for m in consumer.consume(num_messages=100, timeout=0.5):
                    assert m.error() is None, m.error()
                    msg = decode(m.value())
                    out[msg.kind].append(msg)

        try:
            read_until(lambda: {e.group_id for e in out["experience_group"]} >= set(quick), 90,
                       "the quick groups")
            assert not out["dead_letter"] and state["active"] >= 1, "the slow judge call should still hang"
            # faust commits the acked prefix: everything before the slow record, while it still hangs
            deadline = time.monotonic() + 15
            while committed_offsets(kafka, group, topic, [0]) != {0: BEFORE}:
                assert time.monotonic() < deadline, committed_offsets(kafka, group, topic, [0])
                time.sleep(0.5)
            assert not out["dead_letter"], "the commit came after the slow record's timeout: nothing shown"

            read_until(lambda: out["dead_letter"], TIMEOUT_S + 30, "the slow group's dead letter")
            (dead,) = out["dead_letter"]
            assert dead.error_type == "RewardTimeout" and dead.source_offset == BEFORE
            assert f"reward term 'judge' failed on trajectory slow-1 after 1 attempt: timed out after {TIMEOUT_S:g} s" \
                == dead.reason
            deadline = time.monotonic() + 15
            while committed_offsets(kafka, group, topic, [0]) != {0: BEFORE + 1 + AFTER}:
                assert time.monotonic() < deadline, committed_offsets(kafka, group, topic, [0])
                time.sleep(0.5)
            rewards = {e.group_id: e.reward_components["judge"] for e in out["experience_group"]}
            assert all(rewards[g] == [1.0, 0.0] for g in quick) and len(out["experience_group"]) == len(quick)
        finally:
            consumer.close()
            if worker.poll() is None:
                worker.send_signal(signal.SIGTERM)
                try:
                    worker.wait(20)
                except subprocess.TimeoutExpired:
                    worker.kill()
                    worker.wait(10)
        assert worker.returncode == 0, log.read_text()[-3000:]
