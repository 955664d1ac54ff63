"""`consumers/update.py` pieces that need no stack: the ranks' shares of a batch, the zero-weighted
row a rank with no share trains on, and decoupled PPO's proximal log-probs with micro-batches of
different widths (`select` cuts each to its longest row)."""
from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from tests_helpers import random_samples, update_loop  # noqa: E402

DEMO = Path(__file__).resolve().parents[2] / "examples" / "cpu_demo.yaml"
PPO = ("algorithm.policy_loss.type=decoupled_ppo", "trainer.ppo_epochs=2", "trainer.mini_batches=2")


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_rank_shares_cover_the_rows_in_order_and_differ_by_one_at_most(world):
    from streamrft.consumers.update import rank_share

    for rows in range(0, 12):
        shares = [rank_share(rows, world, r) for r in range(world)]
        assert [i for s, e in shares for i in range(s, e)] == list(range(rows))
        sizes = [e - s for s, e in shares]
        assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
        assert sizes[0] == -(-rows // world)


def test_the_padding_row_is_a_real_row_that_weighs_nothing():
    from streamrft.consumers.batch import collate
    from streamrft.consumers.update import padding_row

    batch = collate(random_samples(3, seed=0, vocab=20), pad_id=0)
    pad = padding_row(batch)
    assert len(pad) == 1 and torch.equal(pad.input_ids, batch.input_ids[:1])
    assert pad.mask.sum() == 0 and pad.advantages.tolist() == [0.0] and pad.rewards.tolist() == [0.0]


def test_decoupled_ppo_micro_batches_of_different_widths_match_one_micro_batch(tmp_path):
    """Rows of different lengths, one per micro-batch: the proximal log-probs of each were written into
    the batch's wider tensor (a shape error before), and the updates equal those of one micro-batch."""
    from streamrft.config import load_config
    from streamrft.engine.models import build_char_tokenizer, build_tiny_model
    from streamrft.engine.training.torch_engine import TorchTrainEngine

    tok = build_char_tokenizer("abcdefghijklmnopqrstuvwxyz=")
    weights = []
    for micro in (1, 64):
        cfg = load_config(DEMO, [f"model.path={tmp_path}/unused", "trainer.lr=0.01", *PPO,
                                      f"trainer.micro_batch_size={micro}"])
        model = build_tiny_model(tmp_path / f"m{micro}", tok, hidden_size=32, layers=1, heads=2, seed=0).train()
        loop = update_loop(cfg, TorchTrainEngine(model, cfg.trainer), None, tok)
        for step in range(2):
            metrics = loop.train_step(random_samples(5, seed=step, vocab=len(tok)))
            loop.state.step += 1
            assert metrics["updates"] == 4
        weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert torch.allclose(weights[0], weights[1], atol=1e-4)  # 8 steps of lr 0.01: rounding only
