"""`trainer.autocast`: the policy's matmuls run in bfloat16 while its weights, gradients and optimiser
state stay float32, and a version trains and publishes as without it."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def test_autocast_computes_in_bf16_and_keeps_float32_weights(stack, namespace, trainer_config, kit, monkeypatch):
    import streamrft.engine.precision as precision
    from streamrft.consumers.trainer import Trainer

    # bfloat16 as on a CPU with bf16 kernels (without them the trainer keeps float32: test_precision.py)
    monkeypatch.setattr(precision, "cpu_bf16_fast", lambda: True)
    precision.usable_autocast.cache_clear()

    kit.produce(stack.kafka, namespace, [kit.group("A", 0)])
    cfg = trainer_config(stack, "trainer.autocast=bfloat16", "trainer.batch_groups=1", "trainer.max_steps=1")
    trainer = Trainer(cfg)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    seen = []
    proj = trainer.model.model.layers[0].self_attn.q_proj
    hook = proj.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    result = kit.run(cfg, trainer=trainer)
    hook.remove()
    assert result["version"] == 1 and result["trained"] == 4
    assert seen and set(seen) == {torch.bfloat16}
    after = trainer.model.state_dict()
    assert all(t.dtype == torch.float32 for t in after.values())
    assert any(not torch.equal(after[k], before[k]) for k in before)  # it trained
    assert all(s["exp_avg"].dtype == torch.float32 for s in trainer.engine.optimizer.state_dict()["state"].values())

