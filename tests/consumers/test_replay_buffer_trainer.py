"""Prioritised replay (`trainer.replay_buffer`) on the real stack: a replayed group is a counted
reuse in the audit trail (`<id>#r<k>`) while a redelivered copy is still dropped, and the buffer
is rebuilt from the log (by offset) after the trainer is killed -9."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from streamrft.schemas import WeightVersion, decode, topic_name
from tests_helpers import read_all

ROOT = Path(__file__).resolve().parents[2]
BUFFER = ["trainer.batch_groups=1", "trainer.max_staleness=100", "trainer.replay_buffer.replay_groups=1",
          "trainer.replay_buffer.max_staleness=100"]


def test_replayed_groups_are_counted_reuses_and_redelivery_is_still_dropped(stack, namespace, trainer_config, kit):
    a, b, c = (kit.group(g, version=0) for g in "ABC")
    kit.produce(stack.kafka, namespace, [a, b, a, c])  # A delivered twice
    cfg = trainer_config(stack, *BUFFER, "trainer.replay_buffer.max_reuse=1", "trainer.max_steps=3")
    result = kit.run(cfg)
    # step 1: A; step 2: B + A replayed (A leaves: max_reuse 1); step 3: A' dropped, C + B replayed
    assert (result["trained"], result["replayed"], result["duplicate"], result["groups_trained"]) == (12, 8, 4, 3)
    audit = kit.audit(Path(cfg.output_dir) / "trainer")
    fresh = [f"{g}-{i}" for g in "ABC" for i in range(4)]
    assert sorted(audit) == sorted(fresh + [f"{g}-{i}#r1" for g in "AB" for i in range(4)])
    assert max(audit.values()) == 1


def _announced(kafka, namespace: str) -> list[int]:
    return [decode(m.value(), WeightVersion).version for m in read_all(kafka, topic_name(namespace, "weights"))]


def test_the_buffer_is_rebuilt_from_the_log_after_kill_9(private_stack, namespace, trainer_config, kit, tmp_path):
    from streamrft.config import dump_config
    from streamrft.consumers.trainer import Trainer

    kafka = private_stack.kafka
    overrides = [*BUFFER, "trainer.replay_buffer.max_reuse=5", "trainer.max_steps=10"]
    cfg = trainer_config(private_stack, *overrides)
    ckpt = Path(cfg.output_dir) / "trainer"
    config = tmp_path / "config.yaml"
    config.write_text(dump_config(cfg))
    kit.produce(kafka, namespace, [kit.group(g, 0) for g in "ABC"])
    log = open(tmp_path / "trainer.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "streamrft.cli", "train", str(config)], cwd=ROOT, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while _announced(kafka, namespace)[-1:] != [3]:
            assert proc.poll() is None, (tmp_path / "trainer.log").read_text()[-3000:]
            assert time.monotonic() < deadline, (tmp_path / "trainer.log").read_text()[-3000:]
            time.sleep(0.5)
        os.kill(proc.pid, signal.SIGKILL)  # waiting for a 4th group, checkpoint v3 durable
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    members = json.loads((ckpt / "v3" / "state.json").read_text())["replay_buffer"]
    # A, B, C in the log at offsets 0..2, A replayed at step 2, A or B at step 3
    assert [m["offset"] for m in members] == [0, 1, 2] and sum(m["reuse"] for m in members) == 2

    trainer = Trainer(trainer_config(private_stack, *overrides[:-1], "trainer.max_steps=4"))
    restored = [(e.group.group_id, e.offset, e.reuse, e.priority) for e in trainer.buffer.entries]
    assert restored == [(g, m["offset"], m["reuse"], m["priority"]) for g, m in zip("ABC", members)]
    kit.produce(kafka, namespace, [kit.group("D", 3)])
    result = kit.run(None, trainer=trainer)
    assert (result["step"], result["trained"], result["replayed"]) == (4, 16, 12)
    audit = kit.audit(ckpt)
    assert sorted(k for k in audit if "#" not in k) == sorted(f"{g}-{i}" for g in "ABCD" for i in range(4))
    assert max(audit.values()) == 1  # no use recorded twice: the reuse indices went on from the checkpoint's
    assert len([k for k in audit if "#" in k]) == 12
