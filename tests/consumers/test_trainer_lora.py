"""The trainer with `model.lora` on the real stack: every version is the adapter alone, marked so in
its manifest (version 0 too: B = 0, the base), and a restarted trainer resumes the adapter and its
optimiser state from its checkpoint."""
from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from streamrft.config import LoraSpec  # noqa: E402
from streamrft.infra.objectstore import WeightStore  # noqa: E402

# with a KL term: the reference model is the base, loaded beside the wrapped policy
LORA = ("model.lora={r: 4, alpha: 8, target_modules: [q_proj, v_proj]}", "algorithm.kl.coef=0.05")


def test_lora_trainer_publishes_adapters_and_resumes_them(stack, namespace, trainer_config, kit):
    from streamrft.consumers.trainer import Trainer
    from streamrft.engine.weights import fetch_state_dict

    kit.produce(stack.kafka, namespace, [kit.group("A", 0)])
    assert kit.run(trainer_config(stack, *LORA, "trainer.batch_groups=1", "trainer.max_steps=1"))["version"] == 1
    cfg = trainer_config(stack, *LORA, "trainer.batch_groups=1", "trainer.max_steps=2")
    store, key, cache = WeightStore(stack.s3), cfg.weights_key, Path(cfg.output_dir) / "cache"
    (v0, meta0), (v1, meta1) = (fetch_state_dict(store, key, v, cache) for v in (0, 1))
    assert LoraSpec.from_manifest(meta0) == LoraSpec.from_manifest(meta1) == cfg.model.lora
    assert sorted(v1) == sorted(f"model.layers.0.self_attn.{m}.lora_{ab}.weight" for m in ("q_proj", "v_proj")
                                for ab in "AB")
    b_norms = lambda state: [float(t.norm()) for k, t in state.items() if k.endswith("lora_B.weight")]  # noqa: E731
    assert b_norms(v0) == [0.0, 0.0] and min(b_norms(v1)) > 0

    resumed = Trainer(cfg)
    assert resumed.resumed and resumed.state.version == 1 and resumed.ref_model is not None
    for name, tensor in v1.items():
        assert torch.equal(resumed.engine.publishable_state_dict()[name], tensor), name
    assert len(resumed.engine.optimizer.state_dict()["state"]) == len(v1)  # AdamW's moments of each adapter tensor
    kit.produce(stack.kafka, namespace, [kit.group("B", 1)])
    second = kit.run(cfg, trainer=resumed)
    assert (second["step"], second["version"], second["trained"]) == (2, 2, 8)
    v2, meta2 = fetch_state_dict(store, key, 2, cache)
    assert LoraSpec.from_manifest(meta2) == cfg.model.lora and meta2["step"] == 2
    assert any(not torch.equal(v2[k], v1[k]) for k in v1)
