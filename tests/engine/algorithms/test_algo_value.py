"""Hand-computed clipped value loss."""

import pytest
import torch

from streamrft.engine.algorithms import value_loss


def test_clipped_value_loss_hand_values():
    values = torch.tensor([[1.0, 0.0, 2.0]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[0.5, 0.5, 0.5]], dtype=torch.float64)
    returns = torch.tensor([[2.0, 0.0, 0.0]], dtype=torch.float64)
    # clip 0.2 keeps values in [0.3, 0.7]
    # t0: max((1-2)^2, (0.7-2)^2) = 1.69 (clipped) ; t1: max(0, (0.3-0)^2) = 0.09 (clipped)
    # t2: max((2-0)^2, (0.7-0)^2) = 4 (unclipped) ; 0.5 * (1.69 + 0.09 + 4) / 3 = 0.963333
    loss, metrics = value_loss(values, old, returns, torch.ones(1, 3), clip=0.2)
    loss.backward()
    assert loss.item() == pytest.approx(0.9633333)
    # only t2 has a gradient: 0.5 * 2 * (2 - 0) / 3
    assert torch.allclose(values.grad, torch.tensor([[0.0, 0.0, 2 / 3]], dtype=torch.float64))
    assert metrics["vf_clip_frac"] == pytest.approx(2 / 3)
    assert metrics["value_mean"] == pytest.approx(1.0)


def test_unclipped_value_loss_is_half_mse():
    values = torch.tensor([[1.0, 0.0, 2.0, 5.0]], dtype=torch.float64)
    old = torch.zeros(1, 4, dtype=torch.float64)
    returns = torch.tensor([[2.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    # 0.5 * (1 + 0 + 4) / 3, the fourth token is masked
    loss, _ = value_loss(values, old, returns, torch.tensor([[1, 1, 1, 0]]), clip=None)
    assert loss.item() == pytest.approx(0.8333333)
