"""CHORD's mu schedule and the SFT term (phi-weighted or plain), hand-derived values."""
from __future__ import annotations

import math

import pytest
import torch

from streamrft.consumers.sft_mix import mu_schedule, sft_loss


def test_mu_warms_up_linearly_then_decays_by_cosine_to_the_valley():
    args = dict(warmup_steps=10, decay_steps=10, peak=0.5, valley=0.1)
    assert mu_schedule(0, **args) == 0.0
    assert mu_schedule(5, **args) == pytest.approx(0.25)
    assert mu_schedule(10, **args) == pytest.approx(0.5)
    assert mu_schedule(15, **args) == pytest.approx(0.3)  # cos(pi/2) = 0: half way
    assert mu_schedule(20, **args) == pytest.approx(0.1)
    assert mu_schedule(0, 0, 0, 0.2, 0.2) == pytest.approx(0.2)  # constant mu


def test_sft_loss_is_a_token_mean_with_phi_weights():
    logp = torch.log(torch.tensor([[0.5, 0.25], [0.5, 0.9]]))
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    plain = (math.log(2) + math.log(4) + math.log(2)) / 3
    assert float(sft_loss(logp, mask, phi=False)) == pytest.approx(plain)
    phi = (0.25 * math.log(2) + 0.1875 * math.log(4) + 0.25 * math.log(2)) / 3  # p (1 - p): 0.25, 0.1875
    assert float(sft_loss(logp, mask, phi=True)) == pytest.approx(phi)
