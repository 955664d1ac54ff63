"""Explorers joining and leaving a running run, on the real stack with the tiny demo model.

Trainer, stream ops and explorer 0 run as role processes. Then `streamrft explore --index 5` joins
mid-run: its groups appear on the rollouts topic, and while both are present their task shards
(read back from the groups they publish) are disjoint. Then explorer 5 is killed with -9: the run
goes on (new weight versions) and explorer 0 takes over the tasks of 5's slots.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition

from streamrft.config import dump_config, load_config
from streamrft.infra.kafka import ensure_topics, make_consumer, run_topics
from streamrft.producers.membership import NUM_SLOTS
from streamrft.producers.tasks import load_task_file, task_slot
from streamrft.schemas import RolloutGroup, decode, topic_name
from tests_helpers import demo_overrides, stop_all, trainer_version

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "cpu_demo.yaml"
GRACE_S = 2.0  # a batch in flight when the slots move is still published with the old ones

pytestmark = pytest.mark.slow


@dataclass
class Seen:
    explorer: int  # the --index, from producer_id "explorer-<index>-<pid>"
    slot: int
    created_at: float


class RolloutLog:
    """Every group published to the run's rollouts topic so far: who made it, from which slot."""

    def __init__(self, kafka, topic: str, slot_of: dict[str, int]):
        self.consumer = make_consumer(kafka, None)
        self.consumer.assign([TopicPartition(topic, p, 0) for p in range(kafka.partitions)])
        self.slot_of, self.seen = slot_of, []

    def poll(self, seconds: float) -> list[Seen]:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for m in self.consumer.consume(500, timeout=0.2):
                if m.error() is None:
                    g = decode(m.value(), RolloutGroup)
                    self.seen.append(Seen(int(g.producer_id.split("-")[1]), self.slot_of[g.task.task_id], g.created_at))
        return self.seen

    def slots(self, explorer: int, after: float, before: float = float("inf")) -> set[int]:
        return {s.slot for s in self.seen if s.explorer == explorer and after < s.created_at < before}

    def wait_for(self, cond, timeout: float, what: str, procs: dict) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < deadline, f"{what}: not within {timeout}s"
            for name, p in procs.items():
                assert p.poll() is None, f"{name} exited with {p.returncode}"
            self.poll(0.5)


def _spawn(args: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "streamrft.cli", *args], stdout=open(log, "ab"),
                            stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)


def test_explorer_joins_a_running_run_takes_a_disjoint_shard_and_its_shard_is_taken_over_when_killed(stack, tmp_path):
    from streamrft.launch.prepare import prepare

    ns = f"elastic-{os.getpid()}-{int(time.time())}"
    cfg = prepare(load_config(DEMO, demo_overrides(stack, tmp_path, ["trainer.max_steps=1000", f"namespace={ns}",
                                                                       "explorer.num_explorers=1"])))
    resolved = tmp_path / "config.yaml"
    resolved.write_text(dump_config(cfg))
    ensure_topics(cfg.kafka, run_topics(cfg.kafka, ns, [cfg.explorer.team]))
    tasks = load_task_file(cfg.data.train, cfg.data.prompt_key, cfg.data.answer_key)
    slot_of = {t.task_id: task_slot(i, len(tasks), NUM_SLOTS) for i, t in enumerate(tasks)}
    log = RolloutLog(cfg.kafka, topic_name(ns, "rollouts", cfg.explorer.team), slot_of)
    procs = {"score": _spawn(["score", str(resolved)], tmp_path / "score.log"),
             "train": _spawn(["train", str(resolved)], tmp_path / "train.log"),
             "explore-0": _spawn(["explore", str(resolved), "--index", "0"], tmp_path / "explore-0.log")}
    try:
        # alone, explorer 0 holds every slot
        log.wait_for(lambda: len(log.slots(0, 0)) > 40, 180, "explorer 0 works on the whole file", procs)

        t_join = time.time()
        procs["explore-5"] = _spawn(["explore", str(resolved), "--index", "5"], tmp_path / "explore-5.log")
        log.wait_for(lambda: log.slots(5, 0), 180, "the joining explorer publishes groups", procs)
        t_first5 = min(s.created_at for s in log.seen if s.explorer == 5)
        assert t_first5 > t_join
        log.wait_for(lambda: time.time() > t_first5 + GRACE_S + 15, 60, "both explorers work side by side", procs)
        t_kill = time.time()
        window = (t_first5 + GRACE_S, t_kill)
        mine0, mine5 = log.slots(0, *window), log.slots(5, *window)
        assert mine0 and mine5, (mine0, mine5)
        assert not mine0 & mine5, f"both explorers generated tasks of slots {sorted(mine0 & mine5)}"
        assert len(mine5) > 8  # a real share, not one batch

        # explorer 5 killed: its slots move to explorer 0 after the session timeout, the run goes on
        version_at_kill = trainer_version(tmp_path / "trainer")
        os.kill(procs["explore-5"].pid, signal.SIGKILL)
        procs.pop("explore-5").wait()
        log.wait_for(lambda: log.slots(0, t_kill + GRACE_S) & mine5, 60, "explorer 0 takes over the killed one's tasks",
                     procs)
        log.wait_for(lambda: trainer_version(tmp_path / "trainer") > version_at_kill + 1, 120, "training goes on", procs)
        assert not log.slots(5, t_kill + GRACE_S)
    finally:
        log.consumer.close()
        stop_all(procs)
    # explorer 0 stopped by SIGTERM: a clean exit, after publishing through all of it
    assert procs["explore-0"].returncode == 0, (tmp_path / "explore-0.log").read_text()[-3000:]
