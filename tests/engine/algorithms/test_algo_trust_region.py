"""The step's trust region (`trainer.max_update_kl`): its KL estimate, the scale-back aim and the
interpolation, with hand-derived values."""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from streamrft.engine.algorithms.trust_region import next_scale, set_scale, step_kl  # noqa: E402


def test_step_kl_is_k3_of_the_new_policy_against_the_start_over_sampled_tokens():
    # start p = 0.5 on three tokens; the new policy: 0.25, 0.5, and 0.9 on a masked token
    start = torch.log(torch.tensor([[0.5, 0.5, 0.5]]))
    new = torch.log(torch.tensor([[0.25, 0.5, 0.9]]))
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    # k3 with r = log q - log p: exp(r) - r - 1; token 1: 0.5 + ln 2 - 1 = 0.193147, token 2: 0
    assert step_kl(start, new, mask) == pytest.approx((0.5 + math.log(2) - 1) / 2, rel=1e-6)
    assert step_kl(start, start, mask) == 0.0


def test_next_scale_aims_at_four_fifths_of_the_bound_with_a_quadratic_kl():
    assert next_scale(1.0, 0.08, 0.01) == pytest.approx(math.sqrt(0.1))  # 0.08 x 0.1 = 0.8 x 0.01
    assert next_scale(0.5, 0.02, 0.01) == pytest.approx(0.5 * math.sqrt(0.4))
    with pytest.raises(ValueError, match="within the bound"):
        next_scale(1.0, 0.01, 0.01)


def test_set_scale_interpolates_each_parameter_between_before_and_after():
    p = torch.nn.Parameter(torch.tensor([9.0, 9.0]))
    before, after = [torch.tensor([0.0, 2.0])], [torch.tensor([4.0, 6.0])]
    set_scale([p], before, after, 0.25)
    assert p.tolist() == [1.0, 3.0]
    set_scale([p], before, after, 0.0)
    assert p.tolist() == [0.0, 2.0]
