"""Hand-computed DPO, KTO and SFT losses, and sequence log-probs."""

import pytest
import torch

from streamrft.engine.algorithms import dpo_metrics, kto_kl_ref, sequence_logps, sft_loss
from streamrft.engine.algorithms.offline import dpo_loss, kto_loss


def t(values, grad=False):
    return torch.tensor(values, dtype=torch.float64, requires_grad=grad)


def test_sequence_logps_sums_each_row_under_its_mask():
    token_logps = t([[-1.0, -2.0, -9.0], [-0.5, 7.0, 7.0]])
    # -1 + -2 ; -0.5
    got = sequence_logps(token_logps, torch.tensor([[1, 1, 0], [1, 0, 0]]))
    assert torch.allclose(got, t([-3.0, -0.5]))


def test_dpo_hand_values():
    # beta 0.5: z = 0.5 * ((-1 - -3) - (-2 - -2)) = 1 ; -log sigmoid(1) = log(1 + e^-1) = 0.313262
    chosen = t([-1.0], grad=True)
    loss = dpo_loss(chosen, t([-3.0]), t([-2.0]), t([-2.0]), beta=0.5)
    loss.sum().backward()
    assert loss.shape == (1,)
    assert loss.item() == pytest.approx(0.3132617)
    # d/dchosen = -(1 - sigmoid(1)) * beta = -0.268941 * 0.5
    assert chosen.grad.item() == pytest.approx(-0.1344707)
    # cDPO, ls 0.1: 0.9 * 0.313262 + 0.1 * log(1 + e) = 0.281936 + 0.131326
    smoothed = dpo_loss(t([-1.0]), t([-3.0]), t([-2.0]), t([-2.0]), beta=0.5, label_smoothing=0.1)
    assert smoothed.item() == pytest.approx(0.4132617)


def test_dpo_two_pairs_is_the_mean_of_single_pairs():
    chosen, rejected = t([-1.0, -4.0]), t([-3.0, -2.5])
    ref_chosen, ref_rejected = t([-2.0, -3.0]), t([-2.0, -3.0])
    both = dpo_loss(chosen, rejected, ref_chosen, ref_rejected).mean()
    singles = [
        dpo_loss(chosen[[i]], rejected[[i]], ref_chosen[[i]], ref_rejected[[i]]) for i in range(2)
    ]
    assert both.item() == pytest.approx((singles[0] + singles[1]).item() / 2)


def test_dpo_metrics():
    # chosen reward 0.5 * (-1 + 2) = 0.5 ; rejected 0.5 * (-3 + 2) = -0.5
    metrics = dpo_metrics(t([-1.0]), t([-3.0]), t([-2.0]), t([-2.0]), beta=0.5)
    expected = {"reward_chosen": 0.5, "reward_rejected": -0.5, "reward_margin": 1.0}
    assert metrics == pytest.approx({**expected, "reward_accuracy": 1.0})


def test_kto_hand_values():
    # beta 0.5, z0 0.2, log-ratios r = -1 - -2 = 1 (desirable), -1 - -0.5 = -0.5 (undesirable)
    # desirable: 2 * (1 - sigmoid(0.5 * (1 - 0.2))) = 2 * (1 - sigmoid(0.4)) = 2 * 0.401312
    # undesirable: 1 - sigmoid(0.5 * (0.2 + 0.5)) = 1 - sigmoid(0.35) = 0.413382
    losses = kto_loss(
        t([-1.0, -1.0]),
        t([-2.0, -0.5]),
        torch.tensor([True, False]),
        kl_ref=0.2,
        beta=0.5,
        desirable_weight=2.0,
    )
    assert torch.allclose(losses, t([0.802625, 0.413382]), atol=1e-6)
    # a negative reference KL is clamped to 0: 1 - sigmoid(0.5) = 0.377541
    labels = torch.tensor([True])
    clamped = kto_loss(t([-1.0]), t([-2.0]), labels, kl_ref=torch.tensor(-3.0), beta=0.5)
    assert clamped.item() == pytest.approx(0.3775407)


def test_kto_kl_ref():
    # mean(1, -1) = 0 ; mean(1, 1) = 1 ; mean(-2) clamped to 0
    assert kto_kl_ref(t([-1.0, -3.0]), t([-2.0, -2.0])).item() == 0.0
    assert kto_kl_ref(t([-1.0, -1.0], grad=True), t([-2.0, -2.0])).item() == 1.0
    assert kto_kl_ref(t([-3.0]), t([-1.0])).item() == 0.0
    assert not kto_kl_ref(t([-1.0], grad=True), t([-2.0])).requires_grad


def test_sft_loss():
    # token mean of 1, 2, 3 ; seq-mean-token-sum: (3 + 3) / 2
    logp, mask = t([[-1.0, -2.0], [-3.0, 9.0]]), torch.tensor([[1, 1], [1, 0]])
    assert sft_loss(logp, mask).item() == pytest.approx(2.0)
    assert sft_loss(logp, mask, "seq-mean-token-sum").item() == pytest.approx(3.0)
