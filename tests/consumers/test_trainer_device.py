"""`trainer.device`: the policy, the reference model (KL) and the critic (PPO's GAE) live on one
device and a step runs there, with the KL term in the loss and as a reward penalty. The same code
on the CPU here; the `gpu` variants check CUDA placement (they skip without a GPU)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _samples(kit):
    group = kit.group("A", 0, n=4)
    return [(t.model_copy(update={"response_ids": [5 + i, 4, 2]}), a, r)
            for i, (t, a, r) in enumerate(zip(group.trajectories, [1.0, -1.0, 0.5, -0.5], [1.0, 0.0, 0.7, 0.2]))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kl_mode", ["loss", "reward"])
def test_policy_reference_and_critic_share_the_device(stack, namespace, trainer_config, kit, device, kl_mode):
    from streamrft.consumers.trainer import Trainer

    cfg = trainer_config(stack, f"trainer.device={device}", "algorithm.type=ppo", "algorithm.kl.coef=0.1",
                         f"algorithm.kl.mode={kl_mode}", "trainer.batch_groups=1")
    trainer = Trainer(cfg)
    trainer.consumer.close()
    on = {p.device.type for p in trainer.model.parameters()} | {p.device.type for p in trainer.ref_model.parameters()} \
        | {p.device.type for p in trainer.batch_advantage.critic.parameters()}
    assert on == {device}
    before = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    metrics = trainer.train_step(_samples(kit))
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())
    assert ("reward_kl" in metrics) == (kl_mode == "reward") and ("kl" in metrics) == (kl_mode == "loss")
    assert "value_loss" in metrics  # the critic trained beside the policy
    assert any(not torch.equal(v, before[k]) for k, v in trainer.model.state_dict().items())
