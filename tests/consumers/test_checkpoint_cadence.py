"""`trainer.checkpoint_every` and the background publisher: a trainer killed -9 between two
checkpoints resumes from the last one, redoes the steps since under new version numbers (none
reused), and its audit trail trains each id once; a version's upload overlaps the next step; a
failed upload is retried, and one that keeps failing fails the role instead of being skipped."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from streamrft.infra.objectstore import WeightStore
from streamrft.schemas import Metric, WeightVersion, decode, topic_name
from tests_helpers import read_all, trainer_version

ROOT = Path(__file__).resolve().parents[2]


def _announced(kafka, namespace: str) -> list[int]:
    return [decode(m.value(), WeightVersion).version for m in read_all(kafka, topic_name(namespace, "weights"))]


@pytest.mark.parametrize("sync", ["full", "delta"])
def test_kill_9_between_checkpoints_redoes_the_steps_under_new_versions(private_stack, namespace, trainer_config, kit,
                                                                        tmp_path, sync):
    from streamrft.config import dump_config
    from streamrft.infra.kafka import committed_offsets

    kafka = private_stack.kafka
    overrides = ["trainer.batch_groups=1", "trainer.max_steps=8", "trainer.checkpoint_every=3",
                 "trainer.max_staleness=100", "trainer.keep_versions=100"]
    if sync == "delta":  # snapshots v0, v4 before the kill; a restart starts its chain with a snapshot (v6)
        overrides += ["trainer.weight_sync.delta=true", "trainer.weight_sync.full_every=4"]
    cfg = trainer_config(private_stack, *overrides)
    ckpt, store, key = Path(cfg.output_dir) / "trainer", WeightStore(cfg.s3), cfg.weights_key
    config = tmp_path / "config.yaml"
    config.write_text(dump_config(cfg))
    kit.produce(kafka, namespace, [kit.group(g, 0) for g in "ABCDE"])  # 5 steps: v1..v5, checkpoints v0, v3
    log = open(tmp_path / "trainer.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "streamrft.cli", "train", str(config)], cwd=ROOT, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not (_announced(kafka, namespace)[-1:] == [5]):
            assert proc.poll() is None, (tmp_path / "trainer.log").read_text()[-3000:]
            assert time.monotonic() < deadline, (tmp_path / "trainer.log").read_text()[-3000:]
            time.sleep(0.5)
        os.kill(proc.pid, signal.SIGKILL)  # waiting for a 6th group: between the checkpoints v3 and v6
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    assert trainer_version(ckpt) == 3
    state = json.loads((ckpt / "v3" / "state.json").read_text())
    partition = next(iter(state["offsets"]))
    assert (state["step"], list(state["offsets"].values())) == (3, [3])  # past A, B, C
    p = int(partition.rsplit(":", 1)[1])
    committed = committed_offsets(kafka, f"{namespace}.trainer", topic_name(namespace, "experiences"), [p])
    assert committed[p] == 3  # committed with the checkpoint v3, not past D, E (trained into v4, v5 only)
    assert sorted(json.loads((ckpt / "audit" / "v3.json").read_text())) == sorted(f"{g}-{i}" for g in "ABC" for i in range(4))
    assert store.list_versions(key) == [0, 1, 2, 3, 4, 5]

    kit.produce(kafka, namespace, [kit.group(g, 5) for g in "FGH"])
    result = kit.run(trainer_config(private_stack, *overrides))
    # resumed at step 3 (after C) and redid D, E as v6, v7; F, G, H as v8, v9, v10; checkpoints v8, v10
    assert (result["step"], result["version"], result["trained"], result["duplicate"]) == (8, 10, 32, 0)
    announced = _announced(kafka, namespace)
    assert announced == sorted(set(announced)) == list(range(11)), announced  # none reused, never backwards
    assert [store.read_manifest(key, v).meta["step"] for v in (4, 5, 6, 7, 8)] == [4, 5, 4, 5, 6]
    assert trainer_version(ckpt) == 10
    audit = kit.audit(ckpt)  # the lineage of v10: v0 -> v3 (A, B, C) -> v8 (D, E, F) -> v10 (G, H)
    assert sorted(audit) == sorted(f"{g}-{i}" for g in "ABCDEFGH" for i in range(4)) and max(audit.values()) == 1
    assert sorted(int(f.stem[1:]) for f in (ckpt / "audit").glob("v*.json")) == [0, 3, 8, 10]
    final = json.loads((ckpt / "v10" / "state.json").read_text())
    assert final["offsets"][partition] == state["offsets"][partition] + 5  # nothing below it left untrained
    if sync == "delta":
        _check_delta_chain(store, key, ckpt, tmp_path)


def _check_delta_chain(store, key: str, ckpt: Path, tmp_path: Path) -> None:
    """Every version rebuilds from its chain, checksums verified (`fetch_state_dict` raises on a
    mismatch); the restart's first version is a snapshot (the trainer's chain base died with it);
    the last version is bit-exact the weights of the trainer's last checkpoint."""
    import torch
    from safetensors.torch import load_file

    from streamrft.engine.weights import fetch_state_dict

    metas = {v: store.read_manifest(key, v).meta for v in range(11)}
    assert [v for v, m in metas.items() if "delta_from" not in m] == [0, 4, 6, 10], metas
    assert all(metas[v]["delta_from"] == v - 1 for v in (1, 2, 3, 5, 7, 8, 9))
    states = {v: fetch_state_dict(store, key, v, tmp_path / "cache")[0] for v in range(11)}
    saved = {}
    for f in (ckpt / "v10").glob("*.safetensors"):
        saved.update(load_file(str(f)))
    assert saved and all(torch.equal(states[10][k], t) for k, t in saved.items() if k in states[10])
    assert not torch.equal(states[5]["model.embed_tokens.weight"], states[6]["model.embed_tokens.weight"])


def test_upload_overlaps_the_next_step(stack, namespace, trainer_config, kit, monkeypatch):
    """v1's upload is held until step 2 has started: without the publisher thread, a deadlock."""
    import streamrft.engine.weights as weights
    from streamrft.consumers.trainer import Trainer

    cfg = trainer_config(stack, "trainer.batch_groups=1", "trainer.max_steps=3")
    kit.produce(stack.kafka, namespace, [kit.group("A", 0), kit.group("B", 0), kit.group("C", 1)])  # step 3 (v2) admits v >= 1
    trainer = Trainer(cfg)
    step_2, upload = threading.Event(), weights.publish_state_dict
    overlapped = []

    def held_upload(store, model, version, *args, **kwargs):
        if version == 1:
            overlapped.append(step_2.wait(60))
            time.sleep(0.3)  # an upload that takes at least this: step 2's metrics say so
        return upload(store, model, version, *args, **kwargs)

    step = trainer.train_step

    def train_step(samples, weights=None):
        if trainer.state.step == 1:
            step_2.set()
        return step(samples, weights)

    listings, list_versions = [], WeightStore.list_versions
    monkeypatch.setattr(WeightStore, "list_versions", lambda self, model: listings.append(model) or list_versions(self, model))
    monkeypatch.setattr(weights, "publish_state_dict", held_upload)
    monkeypatch.setattr(trainer, "train_step", train_step)
    result = kit.run(cfg, trainer=trainer)
    assert overlapped == [True] and (result["step"], result["version"]) == (3, 3)
    # the model's versions in S3 are listed at resume and at the first clean-up, not at every version
    assert listings == [cfg.weights_key] * 2
    assert _announced(stack.kafka, namespace) == [0, 1, 2, 3]
    # where publishing went, each step: the step loop's parts of its publish, and the publisher
    # thread's parts of the version it finished last (step 2 waited for v1's held upload)
    steps = {m.step: m.values for m in (decode(r.value(), Metric) for r in read_all(stack.kafka, topic_name(namespace, "metrics")))
             if m.role == "trainer"}
    assert sorted(steps) == [1, 2, 3]
    loop_parts = {"publish_wait_s", "commit_s", "publish_copy_s", "checkpoint_write_s"}
    job_parts = {"upload_s", "checkpoint_finalize_s", "announce_s", "weights_gc_s"}
    assert all(loop_parts <= set(v) and job_parts <= set(v) for v in steps.values()), steps
    assert steps[2]["upload_s"] >= 0.3 and all(steps[2][k] >= 0 for k in loop_parts | job_parts)
    assert sum(steps[2][k] for k in loop_parts) <= steps[2]["publish_s"] + 1e-6


@pytest.mark.parametrize("failures", [2, 99])
def test_a_failed_upload_is_retried_and_never_skipped(stack, namespace, trainer_config, kit, monkeypatch, failures):
    import streamrft.consumers.publisher as publisher
    import streamrft.engine.weights as weights
    from streamrft.consumers.trainer import Trainer

    cfg = trainer_config(stack, "trainer.batch_groups=1", "trainer.max_steps=3")
    kit.produce(stack.kafka, namespace, [kit.group("A", 0), kit.group("B", 0), kit.group("C", 1)])  # step 3 (v2) admits v >= 1
    trainer = Trainer(cfg)
    upload, left = weights.publish_state_dict, {"n": failures}
    monkeypatch.setattr(publisher.time, "sleep", lambda s: None)

    def flaky(store, model, version, *args, **kwargs):
        if version == 2 and left["n"] > 0:
            left["n"] -= 1
            raise ConnectionError("S3 away")
        return upload(store, model, version, *args, **kwargs)

    monkeypatch.setattr(weights, "publish_state_dict", flaky)
    ckpt = Path(cfg.output_dir) / "trainer"
    if failures < 4:
        assert kit.run(cfg, trainer=trainer)["version"] == 3
        assert _announced(stack.kafka, namespace) == [0, 1, 2, 3]
        return
    with pytest.raises(publisher.PublishError, match="v2"):
        kit.run(cfg, trainer=trainer)
    assert trainer_version(ckpt) == 1 and _announced(stack.kafka, namespace) == [0, 1]


def test_a_stop_between_checkpoints_checkpoints_the_last_version(stack, namespace, trainer_config, kit):
    """SIGTERM (the stop event) two versions after a checkpoint, with checkpoint_every=5: the run
    ends with a checkpoint of v2, so a graceful stop redoes nothing."""
    from streamrft.consumers.trainer import Trainer

    cfg = trainer_config(stack, "trainer.batch_groups=1", "trainer.max_steps=10", "trainer.checkpoint_every=5")
    kit.produce(stack.kafka, namespace, [kit.group("A", 0), kit.group("B", 0)])
    trainer = Trainer(cfg)
    step = trainer.train_step

    def train_step(samples, weights=None):
        if trainer.state.step == 1:
            trainer.stop.set()  # checked when the loop collects the next batch, after v2 is published
        return step(samples, weights)

    trainer.train_step = train_step
    result = kit.run(cfg, trainer=trainer)
    ckpt = Path(cfg.output_dir) / "trainer"
    assert (result["step"], result["version"], trainer_version(ckpt)) == (2, 2, 2)
    assert sorted(kit.audit(ckpt)) == sorted(f"{g}-{i}" for g in "AB" for i in range(4))
    assert _announced(stack.kafka, namespace) == [0, 1, 2]
    assert json.loads((ckpt / "v2" / "state.json").read_text())["step"] == 2
