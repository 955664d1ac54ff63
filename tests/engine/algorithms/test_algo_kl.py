"""KL estimators against their per-token formulas and the exact KL of a small categorical."""

import math

import pytest
import torch

from streamrft.engine.algorithms import KL_ESTIMATORS, entropy_from_logits, kl_penalty_rewards
from streamrft.engine.algorithms.kl import k1, k2, k3, low_var_kl

P = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
Q = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)
# KL(p||q) = 0.5 ln 2.5 + 0.3 ln 0.6 + 0.2 ln(2/3) = 0.458145 - 0.153248 - 0.081093
KL_PQ = 0.2238047


def test_per_token_formulas():
    logp, ref = torch.tensor([[-1.0]]), torch.tensor([[-2.0]])
    assert k1(logp, ref).item() == pytest.approx(1.0)  # -1 - (-2)
    assert k2(logp, ref).item() == pytest.approx(0.5)  # 0.5 * 1^2
    # log(q/p) = -1: e^-1 - (-1) - 1 = 0.367879
    assert k3(logp, ref).item() == pytest.approx(0.3678794)
    assert low_var_kl(logp, ref).item() == pytest.approx(0.3678794)


def test_low_var_kl_clamps_like_verl():
    # log(q/p) = 30 -> clamped to 20, e^20 - 21 -> clamped to 10
    assert low_var_kl(torch.tensor([-30.0]), torch.tensor([0.0])).item() == 10.0
    # log(q/p) = -30: unclamped k3 = e^-30 + 29, clamped to 10
    assert k3(torch.tensor([0.0]), torch.tensor([-30.0])).item() == pytest.approx(29.0)
    assert low_var_kl(torch.tensor([0.0]), torch.tensor([-30.0])).item() == 10.0


@pytest.mark.parametrize("name", ["k1", "k3", "low_var_kl"])
def test_unbiased_estimators_have_exact_expectation_kl(name):
    # E_{x~p}[k(x)] by enumerating the three outcomes, weighted by p
    per_outcome = KL_ESTIMATORS[name](P.log(), Q.log())
    assert (P * per_outcome).sum().item() == pytest.approx(KL_PQ)


def test_k1_sample_mean_converges_to_kl():
    generator = torch.Generator().manual_seed(0)
    samples = torch.multinomial(P, 20000, replacement=True, generator=generator)
    estimate = k1(P.log()[samples], Q.log()[samples]).mean().item()
    assert estimate == pytest.approx(KL_PQ, abs=0.02)


def test_k2_is_nonnegative_and_matches_kl_for_close_distributions():
    # for q close to p, E_p[k2] ~= KL(p||q) to second order
    q_close = torch.tensor([0.49, 0.31, 0.2], dtype=torch.float64)
    exact = (P * (P.log() - q_close.log())).sum().item()
    estimate = (P * k2(P.log(), q_close.log())).sum().item()
    assert estimate == pytest.approx(exact, rel=0.05)
    assert (k2(P.log(), Q.log()) >= 0).all()


def test_kl_penalty_rewards():
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    kl = torch.tensor([[0.1, 0.2, 0.3]], requires_grad=True)
    # r - 0.5 * kl
    got = kl_penalty_rewards(rewards, kl, 0.5)
    assert torch.allclose(got, torch.tensor([[-0.05, -0.1, 0.85]]))
    assert not got.requires_grad
    got = kl_penalty_rewards(rewards, kl, 0.5, mask=torch.tensor([[1, 1, 0]]))
    assert torch.allclose(got, torch.tensor([[-0.05, -0.1, 0.0]]))


def test_entropy_from_logits():
    # uniform over 4: ln 4 ; probs 0.25 / 0.75: -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.562335
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [0.0, math.log(3.0), -1e9, -1e9]]])
    entropy = entropy_from_logits(logits)
    assert entropy.shape == (1, 2)
    assert torch.allclose(entropy, torch.tensor([[1.3862944, 0.5623351]]))
