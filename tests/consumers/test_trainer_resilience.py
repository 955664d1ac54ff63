"""The trainer rides out what a long run meets: a broker restarted under it (it rejoins its group,
retries its offset commit, loses and repeats nothing, even when the rejoin drops the records it
had fetched for the batch it is collecting), and a restart that finds S3 or the weights
topic ahead of its checkpoint (no version number goes backwards or is reused)."""
from __future__ import annotations

import threading
import time
from pathlib import Path

from streamrft.infra.kafka import flush_or_raise, make_producer
from streamrft.infra.objectstore import WeightStore
from streamrft.schemas import WeightVersion, decode, encode, topic_name
from tests_helpers import read_all


def _announced(kafka, namespace: str) -> list[int]:
    return [decode(m.value(), WeightVersion).version for m in read_all(kafka, topic_name(namespace, "weights"))]


def test_trainer_rides_out_a_broker_restart(private_stack, namespace, trainer_config, kit, monkeypatch):
    """The broker dies while the trainer is busy with step 2 and comes back after the trainer's
    group session expired: the commit after step 2 meets UNKNOWN_MEMBER_ID on Tansu (it used to
    kill the trainer), is retried while the consumer rejoins, and training goes on to the end."""
    from streamrft.consumers.trainer import Trainer

    kafka, es = private_stack.kafka, private_stack.embedded
    cfg = trainer_config(private_stack, "trainer.batch_groups=1", "trainer.max_steps=3")
    ckpt = Path(cfg.output_dir) / "trainer"
    kit.produce(kafka, namespace, [kit.group("A", 0), kit.group("B", 0)])
    trainer = Trainer(cfg)
    in_step_2, resume = threading.Event(), threading.Event()
    step = trainer.train_step

    def held_step(samples, weights=None):
        if trainer.state.step == 1:
            in_step_2.set()
            resume.wait(120)
        return step(samples, weights)

    monkeypatch.setattr(trainer, "train_step", held_step)
    outcome: dict = {}

    def train():
        try:
            outcome["result"] = kit.run(cfg, timeout_s=240, trainer=trainer)
        except BaseException as e:  # reported by the assertion below
            outcome["error"] = e

    thread = threading.Thread(target=train)
    thread.start()
    try:
        assert in_step_2.wait(120), outcome
        es.kill("tansu")  # SIGKILL, down for longer than the trainer's group session
        time.sleep(2 * kafka.session_timeout_ms / 1000)
        es.restart("tansu")
    finally:
        resume.set()
    kit.produce(kafka, namespace, [kit.group("C", 1)])
    thread.join(300)
    assert not thread.is_alive() and "result" in outcome, outcome
    result = outcome["result"]
    assert (result["step"], result["version"], result["trained"], result["duplicate"]) == (3, 3, 12, 0)
    audit = kit.audit(ckpt)
    assert sorted(audit) == sorted(f"{g}-{i}" for g in "ABC" for i in range(4)) and max(audit.values()) == 1
    assert _announced(kafka, namespace) == [0, 1, 2, 3]


def test_a_rebalance_inside_the_top_up_poll_is_no_crash(private_stack, namespace, trainer_config, kit, monkeypatch):
    """The crash of the 12-kill chaos run: `collect()` saw fetched records, topped them up with a
    poll, and that poll rejoined the group after a broker restart: `_on_assign` dropped every
    fetched record, and `_take()` ran `oldest_head` on nothing (`min() arg is an empty sequence`).
    Here the broker is restarted at that very moment, and the trainer must go on, train each
    trajectory once, and lose none."""
    from streamrft.consumers.trainer import Trainer

    kafka, es = private_stack.kafka, private_stack.embedded
    cfg = trainer_config(private_stack, "trainer.batch_groups=2", "trainer.max_steps=2")
    kit.produce(kafka, namespace, [kit.group(g, 0) for g in "ABCD"])
    trainer = Trainer(cfg)
    assigned = threading.Event()

    def on_assign(consumer, partitions):
        trainer._on_assign(consumer, partitions)
        assigned.set()

    trainer.consumer.subscribe([trainer.topic], on_assign=on_assign)
    poll = trainer._poll
    dropped: list[int] = []

    def poll_through_a_restart(timeout):
        if timeout != 0 or dropped or not trainer.pending:
            return poll(timeout)
        # the top-up poll with records fetched: the broker goes away for longer than the group
        # session, and this poll is the one that rejoins (the records come back in later polls)
        assigned.clear()
        es.kill("tansu")
        time.sleep(2 * kafka.session_timeout_ms / 1000)
        es.restart("tansu")
        deadline = time.monotonic() + 120
        while not assigned.is_set() and time.monotonic() < deadline:
            poll(0)  # as the top-up does: the rejoin's callback runs, and no fetch has answered yet
            time.sleep(0.05)
        dropped.append(len(trainer.pending))

    monkeypatch.setattr(trainer, "_poll", poll_through_a_restart)
    result = kit.run(cfg, timeout_s=240, trainer=trainer)
    assert dropped == [0], f"the rejoin left {dropped} records fetched: the crash's moment was not reproduced"
    assert (result["step"], result["trained"], result["duplicate"]) == (2, 16, 0), result
    audit = kit.audit(Path(cfg.output_dir) / "trainer")
    assert sorted(audit) == sorted(f"{g}-{i}" for g in "ABCD" for i in range(4)) and max(audit.values()) == 1


def test_a_restart_never_reuses_or_lowers_a_version(stack, namespace, trainer_config, kit):
    from streamrft.engine.weights import fetch_state_dict, publish_state_dict

    kit.produce(stack.kafka, namespace, [kit.group("A", 0)])
    first = kit.run(trainer_config(stack, "trainer.batch_groups=1", "trainer.max_steps=1"))
    assert first["version"] == 1
    cfg = trainer_config(stack, "trainer.batch_groups=1", "trainer.max_steps=2")
    store, key = WeightStore(stack.s3), cfg.weights_key
    # a trainer that died after uploading v2, before v2's checkpoint: in S3, never announced
    v1, _ = fetch_state_dict(store, key, 1, Path(cfg.output_dir) / "cache")
    publish_state_dict(store, key, 2, {k: t + 1 for k, t in v1.items()}, meta={"step": 99})
    kit.produce(stack.kafka, namespace, [kit.group("B", 1)])
    second = kit.run(cfg)
    assert second["version"] == 2
    meta = store.read_manifest(key, 2).meta
    base = store.read_manifest(key, 0).meta["base"]
    assert (meta["step"], meta["kind"], meta["base"]) == (2, "full", base)  # redone, not the orphan
    assert _announced(stack.kafka, namespace) == [0, 1, 2]  # v1 not announced again: it already was

    # announced above the newest checkpoint: as if the checkpoints after v2 had been wiped
    wv = WeightVersion(model=cfg.model.name, version=7, bucket=store.bucket, prefix=store.prefix(key, 7))
    producer = make_producer(stack.kafka)
    producer.produce(topic_name(namespace, "weights"), key=cfg.model.name.encode(), value=encode(wv))
    flush_or_raise(producer)
    kit.produce(stack.kafka, namespace, [kit.group("C", 7)])
    third = kit.run(trainer_config(stack, "trainer.batch_groups=1", "trainer.max_steps=3"))
    assert (third["step"], third["version"], third["trained"]) == (3, 8, 12)
    assert _announced(stack.kafka, namespace) == [0, 1, 2, 7, 8]
    assert store.list_versions(key)[-1] == 8
    audit = kit.audit(Path(cfg.output_dir) / "trainer")
    assert sorted(audit) == sorted(f"{g}-{i}" for g in "ABC" for i in range(4)) and max(audit.values()) == 1
