"""CHORD on the real stack: every step mixes the RL batch with expert rows from a JSONL file, the
SFT term is in the loss (it moves the weights even when the RL rows carry no advantage), mu
follows its schedule and each source's share of the rows is a metric."""
from __future__ import annotations

import json

import pytest

from streamrft.schemas import Metric, decode, topic_name
from tests_helpers import read_all


def test_chord_mixes_expert_rows_into_each_step(stack, namespace, trainer_config, kit, tmp_path):
    from streamrft.consumers.trainer import Trainer

    data = tmp_path / "expert.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"rev {w}=", "completion": w[::-1]}) + "\n"
                            for w in ("ab", "abc", "cab")))
    flat = [kit.group(g, 0) for g in "AB"]
    for g in flat:  # no RL signal: whatever the weights learn comes from the SFT term
        g.advantages = [0.0] * len(g.advantages)
    kit.produce(stack.kafka, namespace, flat)
    cfg = trainer_config(stack, "trainer.batch_groups=1", "trainer.max_steps=2", f"trainer.sft_mix.path={data}",
                         "trainer.sft_mix.rows_per_step=2", "trainer.sft_mix.mu_warmup_steps=2",
                         "trainer.sft_mix.mu_peak=0.5")
    trainer = Trainer(cfg)
    before = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
    result = kit.run(cfg, trainer=trainer)
    assert (result["step"], result["trained"]) == (2, 8)
    moved = sum(float((v.detach() - before[k]).abs().sum()) for k, v in trainer.model.named_parameters())
    assert moved > 0
    metrics = [decode(m.value(), Metric) for m in read_all(stack.kafka, topic_name(namespace, "metrics"))]
    steps = sorted((m.step, m.values) for m in metrics if m.role == "trainer" and "chord_mu" in m.values)
    assert [s for s, _ in steps] == [1, 2]
    assert [v["chord_mu"] for _, v in steps] == pytest.approx([0.0, 0.25])  # warm-up: 0/2, 1/2 of the peak
    for _, v in steps:
        assert v["share_sft"] == pytest.approx(2 / 6) and v["share_rl"] == pytest.approx(4 / 6)
        assert v["sft_loss"] > 0
