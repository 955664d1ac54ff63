"""A group delivered twice (stream ops redo records after their own crash) is trained once: when
both copies land in one batch, in neighbouring batches, or on both sides of a trainer restart.
And a record that makes the trainer raise anywhere becomes a dead letter; the trainer goes on.
Real stack, the CPU demo's tiny model; the audit trail says what each durable version trained."""
from __future__ import annotations

from pathlib import Path

import pytest

from streamrft.schemas import DeadLetter, ExperienceGroup, decode, topic_name
from tests_helpers import read_all


@pytest.mark.parametrize("where", ["same-batch", "next-batch", "after-restart"])
def test_a_group_delivered_twice_is_trained_once(stack, namespace, trainer_config, kit, where):
    a, b, c, d = (kit.group(g, version=0) for g in "ABCD")
    ckpt = Path(trainer_config(stack).output_dir) / "trainer"
    if where == "same-batch":  # [A, B, A', C] with 3 groups a batch: A' must not fill the third place
        kit.produce(stack.kafka, namespace, [a, b, a, c])
        result = kit.run(trainer_config(stack, "trainer.batch_groups=3", "trainer.max_steps=1"))
        trained = "ABC"
    elif where == "next-batch":  # [A, B] then [A', C, D]
        kit.produce(stack.kafka, namespace, [a, b, a, c, d])
        result = kit.run(trainer_config(stack, "trainer.batch_groups=2", "trainer.max_steps=2"))
        trained = "ABCD"
    else:  # [A, B] trained and checkpointed, the trainer stops; a new one reads [A', C, D]
        kit.produce(stack.kafka, namespace, [a, b])
        first = kit.run(trainer_config(stack, "trainer.batch_groups=2", "trainer.max_steps=1"))
        assert (first["version"], first["trained"]) == (1, 8)
        kit.produce(stack.kafka, namespace, [a, c, d])
        result = kit.run(trainer_config(stack, "trainer.batch_groups=2", "trainer.max_steps=2"))
        trained = "ABCD"
    audit = kit.audit(ckpt)
    assert sorted(audit) == sorted(f"{g}-{i}" for g in trained for i in range(4))
    assert max(audit.values()) == 1, "a trajectory was trained twice"
    assert result["trained"] == 4 * len(trained) and result["duplicate"] == 4 and result["stale"] == 0
    assert result["groups_trained"] == len(trained)


def test_a_record_that_makes_the_trainer_raise_anywhere_is_dead_lettered(stack, namespace, trainer_config, kit,
                                                                          monkeypatch):
    from streamrft.consumers.trainer import Trainer

    cfg = trainer_config(stack, "trainer.batch_groups=2", "trainer.max_steps=1")
    kit.produce(stack.kafka, namespace, [kit.group("A", 0), kit.group("boom", 0), kit.group("B", 0)])
    trainer = Trainer(cfg)
    check = trainer._check_fits_model

    def check_or_fail(eg: ExperienceGroup) -> None:  # a bug that only this record trips over
        if eg.group_id == "boom":
            raise KeyError("injected fault")
        check(eg)

    monkeypatch.setattr(trainer, "_check_fits_model", check_or_fail)
    result = kit.run(cfg, trainer=trainer)
    assert (result["step"], result["trained"], result["dead_lettered"]) == (1, 8, 1)

    dead = [decode(m.value(), DeadLetter) for m in read_all(stack.kafka, topic_name(namespace, "dlq"))]
    assert len(dead) == 1
    d = dead[0]
    assert d.error_type == "KeyError" and "injected fault" in d.reason and d.role == "trainer"
    experiences = read_all(stack.kafka, topic_name(namespace, "experiences"))
    boom = next(m for m in experiences if decode(m.value(), ExperienceGroup).group_id == "boom")
    assert (d.source_topic, d.source_partition, d.source_offset) == (boom.topic(), boom.partition(), boom.offset())
    assert d.value == boom.value()  # the original bytes
