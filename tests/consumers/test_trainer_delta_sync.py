"""The trainer with `trainer.weight_sync.delta`: versions go to S3 as deltas from the one before with
a full snapshot every `full_every`, GC keeps the snapshot the newest chain needs, and what a reader
rebuilds is the trainer's checkpointed weights, bit for bit."""
from __future__ import annotations

from pathlib import Path

import torch

from streamrft.consumers import checkpoint
from streamrft.engine.weights import fetch_state_dict, load_shards
from streamrft.infra.objectstore import WeightStore


def test_the_trainer_publishes_deltas(stack, namespace, trainer_config, kit):
    kit.produce(stack.kafka, namespace, [kit.group(g, 0) for g in "ABC"])
    cfg = trainer_config(stack, "trainer.batch_groups=1", "trainer.max_steps=3", "trainer.max_staleness=5",
                         "trainer.keep_versions=1", "trainer.weight_sync.delta=true", "trainer.weight_sync.full_every=2")
    result = kit.run(cfg)
    assert result["version"] == 3
    store, key = WeightStore(stack.s3), cfg.weights_key
    assert store.list_versions(key) == [2, 3]  # v3 is a delta from the snapshot v2, which GC keeps
    full, delta = store.read_manifest(key, 2), store.read_manifest(key, 3)
    assert "delta_from" not in full.meta and full.meta["full_every"] == 2
    assert (delta.meta["delta_from"], delta.meta["snapshot"], delta.meta["kind"], delta.meta["step"]) == (2, 2, "full", 3)
    assert all(name.endswith(".st.zst") for name in delta.files)
    state, _ = fetch_state_dict(store, key, 3, Path(cfg.output_dir) / "cache")  # rebuilt from v2
    ckpt_dir, ckpt = checkpoint.latest(Path(cfg.output_dir) / "trainer")
    assert ckpt.version == 3
    saved = load_shards(ckpt_dir)
    assert set(state) <= set(saved)
    for name, t in state.items():
        assert torch.equal(t, saved[name].to(t.dtype)), name
