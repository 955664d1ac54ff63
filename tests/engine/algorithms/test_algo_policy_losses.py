"""Hand-computed policy losses (values and gradients) and their equivalences."""

import math

import pytest
import torch

from streamrft.engine.algorithms.policy_losses import cispo, decoupled_ppo, gspo, pg, ppo, sft


def leaf(values):
    return torch.tensor(values, dtype=torch.float64, requires_grad=True)


def t(values):
    return torch.tensor(values, dtype=torch.float64)


def test_ppo_asymmetric_clip_hand_values():
    # ratios 1.5, 0.5, 1.1, 0.7 ; advantages 1, 1, -1, -1 ; bounds [0.8, 1.28]
    # tok0: max(-1.5, -1.28) = -1.28 (clipped, no grad)
    # tok1: max(-0.5, -0.8)  = -0.5  (unclipped, grad -A*r = -0.5)
    # tok2: max(1.1, 1.1)    = 1.1   (inside, grad -A*r = 1.1)
    # tok3: max(0.7, 0.8)    = 0.8   (clipped, no grad)
    # token mean: (-1.28 - 0.5 + 1.1 + 0.8) / 4 = 0.03
    logp = leaf([[0.0, 0.0, 0.0, 0.0]])
    old = -torch.log(t([[1.5, 0.5, 1.1, 0.7]]))
    adv = t([[1.0, 1.0, -1.0, -1.0]])
    loss, metrics = ppo(logp, old, adv, torch.ones(1, 4), clip_low=0.2, clip_high=0.28)
    loss.backward()
    assert loss.item() == pytest.approx(0.03)
    assert torch.allclose(logp.grad, t([[0.0, -0.125, 0.275, 0.0]]))
    assert metrics["clip_frac"] == pytest.approx(0.5)
    assert metrics["ratio_mean"] == pytest.approx(0.95)
    # mean of -log ratio = -ln(1.5 * 0.5 * 1.1 * 0.7) / 4
    assert metrics["approx_kl"] == pytest.approx(0.1372617)
    assert all(isinstance(v, float) for v in metrics.values())


def test_ppo_dual_clip_caps_negative_advantages():
    # ratio 5, A = -2: clipped surrogate max(10, 2.4) = 10, capped at -A * 3 = 6 (no grad)
    logp, old, adv, mask = leaf([[0.0]]), t([[-math.log(5.0)]]), t([[-2.0]]), torch.ones(1, 1)
    loss, metrics = ppo(logp, old, adv, mask, clip_c=3.0)
    loss.backward()
    assert loss.item() == pytest.approx(6.0)
    assert logp.grad.item() == 0.0
    assert metrics["clip_frac_lower"] == 1.0
    # without dual clip: 10, gradient -A * r = 10
    logp = leaf([[0.0]])
    loss, _ = ppo(logp, old, adv, mask)
    loss.backward()
    assert loss.item() == pytest.approx(10.0)
    assert logp.grad.item() == pytest.approx(10.0)


def test_ppo_at_ratio_one_equals_vanilla_pg_value_and_gradient():
    torch.manual_seed(0)
    base = torch.randn(3, 5, dtype=torch.float64)
    adv = torch.randn(3, 5, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    lp1, lp2 = base.clone().requires_grad_(), base.clone().requires_grad_()
    loss_ppo, _ = ppo(lp1, base, adv, mask, clip_c=3.0)
    loss_pg, _ = pg(lp2, base, adv, mask)
    loss_ppo.backward()
    loss_pg.backward()
    assert loss_ppo.item() == pytest.approx(loss_pg.item())
    assert torch.allclose(lp1.grad, lp2.grad)


def test_pg_hand_values():
    # value is -A token-mean: (-2 + 1) / 2 ; gradient -A / 2
    logp = leaf([[-1.0, -3.0]])
    loss, metrics = pg(logp, None, t([[2.0, -1.0]]), torch.ones(1, 2))
    loss.backward()
    assert loss.item() == pytest.approx(-0.5)
    assert torch.allclose(logp.grad, t([[-1.0, 0.5]]))
    assert metrics["advantage_mean"] == pytest.approx(0.5)


def test_sequence_advantages_broadcast_to_tokens():
    torch.manual_seed(1)
    logp, old = torch.randn(2, 3, dtype=torch.float64), torch.randn(2, 3, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    adv = t([0.7, -1.2])
    for fn in (ppo, gspo, cispo, pg, decoupled_ppo):
        by_seq, _ = fn(logp, old, adv, mask)
        by_token, _ = fn(logp, old, adv[:, None].expand(2, 3), mask)
        assert by_seq.item() == pytest.approx(by_token.item())


def test_gspo_hand_values():
    # token log-ratios 0.2 and 0.0 (third token padded): sequence ratio exp(0.1) = 1.105171
    # bounds [0.8, 1.2] leave it unclipped; loss per token -A * 1.105171 with A = 1;
    # seq-mean-token-mean -> -1.105171; d/dlogp_t = -1.105171 / 2 tokens
    logp = leaf([[0.0, 0.0, 0.0]])
    old, mask = t([[-0.2, 0.0, 5.0]]), torch.tensor([[1, 1, 0]])
    loss, metrics = gspo(logp, old, t([1.0]), mask, clip_low=0.2, clip_high=0.2)
    loss.backward()
    assert loss.item() == pytest.approx(-1.1051709)
    assert torch.allclose(logp.grad, t([[-0.5525855, -0.5525855, 0.0]]))
    assert metrics["clip_frac"] == 0.0
    # paper bounds (3e-4, 4e-4): ratio clipped to 1.0004, no gradient
    logp = leaf([[0.0, 0.0, 0.0]])
    loss, metrics = gspo(logp, old, t([1.0]), mask)
    loss.backward()
    assert loss.item() == pytest.approx(-1.0004)
    assert torch.count_nonzero(logp.grad) == 0
    assert metrics["clip_frac"] == 1.0


def test_gspo_on_one_token_sequences_equals_ppo():
    torch.manual_seed(2)
    base = 0.3 * torch.randn(6, 1, dtype=torch.float64)
    old = torch.zeros(6, 1, dtype=torch.float64)
    adv = torch.randn(6, dtype=torch.float64)
    mask = torch.ones(6, 1)
    lp1, lp2 = base.clone().requires_grad_(), base.clone().requires_grad_()
    loss_g, _ = gspo(lp1, old, adv, mask, clip_low=0.2, clip_high=0.28, agg_mode="token-mean")
    loss_p, _ = ppo(lp2, old, adv, mask, clip_low=0.2, clip_high=0.28)
    loss_g.backward()
    loss_p.backward()
    assert loss_g.item() == pytest.approx(loss_p.item())
    assert torch.allclose(lp1.grad, lp2.grad)


def test_cispo_hand_values():
    # logp -1, -2 ; ratios 1.5, 0.5 ; A = 1, -1 ; weights clip(., max=1.28): 1.28, 0.5
    # tok0: -1.28 * 1 * -1 = 1.28 ; tok1: -0.5 * -1 * -2 = -1.0 ; mean 0.14
    # grad -w * A / 2: -0.64, 0.25
    logp = leaf([[-1.0, -2.0]])
    old = t([[-1.0 - math.log(1.5), -2.0 - math.log(0.5)]])
    loss, metrics = cispo(logp, old, t([[1.0, -1.0]]), torch.ones(1, 2))
    loss.backward()
    assert loss.item() == pytest.approx(0.14)
    assert torch.allclose(logp.grad, t([[-0.64, 0.25]]))
    assert metrics["clip_frac"] == 0.5
    # a lower bound 0.8 lifts the second weight: -0.8 * -1 * -2 = -1.6 ; (1.28 - 1.6) / 2
    loss, _ = cispo(logp, old, t([[1.0, -1.0]]), torch.ones(1, 2), clip_low=0.2)
    assert loss.item() == pytest.approx(-0.16)


def test_decoupled_ppo_truncated_weight_hand_values():
    # behaviour -1, -1 ; prox = behaviour + ln 1.5, + ln 3 -> w = 1.5, min(3, 2) = 2
    # current = prox (ratio 1): PPO term -A ; A = 1, -1 -> -1.5, +2 ; mean 0.25
    # grad -A * w / 2: -0.75, 1.0
    behav = t([[-1.0, -1.0]])
    prox = behav + torch.log(t([[1.5, 3.0]]))
    logp = prox.clone().requires_grad_()
    loss, metrics = decoupled_ppo(
        logp, behav, t([[1.0, -1.0]]), torch.ones(1, 2), prox_logprobs=prox, tis_cap=2.0
    )
    loss.backward()
    assert loss.item() == pytest.approx(0.25)
    assert torch.allclose(logp.grad, t([[-0.75, 1.0]]))
    assert metrics["tis_weight_mean"] == pytest.approx(1.75)
    assert metrics["tis_trunc_frac"] == pytest.approx(0.5)


def test_decoupled_ppo_without_prox_is_ppo():
    torch.manual_seed(3)
    base, old = torch.randn(2, 4, dtype=torch.float64), torch.randn(2, 4, dtype=torch.float64)
    adv, mask = torch.randn(2, 4, dtype=torch.float64), torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    lp1, lp2 = base.clone().requires_grad_(), base.clone().requires_grad_()
    loss_d, _ = decoupled_ppo(lp1, old, adv, mask, clip_c=3.0)
    loss_p, _ = ppo(lp2, old, adv, mask, clip_c=3.0)
    loss_d.backward()
    loss_p.backward()
    assert loss_d.item() == pytest.approx(loss_p.item())
    assert torch.allclose(lp1.grad, lp2.grad)


def test_sft_is_masked_nll():
    # (1 + 2 + 3) / 3 valid tokens; the masked 9 is ignored
    logp = leaf([[-1.0, -2.0], [-3.0, 9.0]])
    loss, metrics = sft(logp, None, None, torch.tensor([[1, 1], [1, 0]]))
    loss.backward()
    assert loss.item() == pytest.approx(2.0)
    assert torch.allclose(logp.grad, t([[-1 / 3, -1 / 3], [-1 / 3, 0.0]]))
    assert metrics["nll"] == pytest.approx(2.0)


def test_unknown_param_is_an_error():
    with pytest.raises(TypeError):
        ppo(t([[0.0]]), t([[0.0]]), t([[1.0]]), torch.ones(1, 1), clip_ratio=0.2)


def test_ppo_iw_band_drops_tokens_whose_ratio_leaves_it():
    # ratios 1.5, 0.2, 5, 1 ; A = 1, 1, -1, -1 ; clip 0.2 ; band 4: [0.25, 4]
    # tok0: max(-1.5, -1.2) = -1.2 (clipped, no grad)   tok1: 0.2 < 0.25, dropped
    # tok2: 5 > 4 (the stale negative token the clip leaves unbounded), dropped   tok3: 1.0, grad -A r / 4 = 0.25
    # token mean over all 4 (dropped tokens stay in the denominator): (-1.2 + 1.0) / 4 = -0.05
    logp = leaf([[0.0, 0.0, 0.0, 0.0]])
    old = -torch.log(t([[1.5, 0.2, 5.0, 1.0]]))
    adv = t([[1.0, 1.0, -1.0, -1.0]])
    loss, metrics = ppo(logp, old, adv, torch.ones(1, 4), iw_band=4.0)
    loss.backward()
    assert loss.item() == pytest.approx(-0.05)
    assert torch.allclose(logp.grad, t([[0.0, 0.0, 0.0, 0.25]]))
    assert metrics["iw_band_frac"] == pytest.approx(0.5)
    # without the band the stale negative token alone outweighs the rest: (-1.2 - 0.2 + 5 + 1) / 4
    loss, metrics = ppo(leaf([[0.0, 0.0, 0.0, 0.0]]), old, adv, torch.ones(1, 4))
    assert loss.item() == pytest.approx(1.15) and "iw_band_frac" not in metrics
    with pytest.raises(ValueError, match=r"params.iw_band=1.0: must be > 1"):
        ppo(logp, old, adv, torch.ones(1, 4), iw_band=1.0)


def test_decoupled_ppo_mask_mode_and_floor_hand_values():
    # behaviour -1 ; prox = behaviour + ln 1.5, ln 3, ln 0.25 -> w = 1.5, 3, 0.25 ; current = prox (ratio 1)
    # A = 1, -1, 1 -> PPO terms -1, +1, -1 ; cap 2, floor 0.5: 3 and 0.25 leave the band
    behav = t([[-1.0, -1.0, -1.0]])
    prox = behav + torch.log(t([[1.5, 3.0, 0.25]]))
    adv, mask = t([[1.0, -1.0, 1.0]]), torch.ones(1, 3)
    # mask (AReaL): weights 1.5, 0, 0 -> loss -1.5 / 3 = -0.5, grad -A w / 3 = -0.5, 0, 0
    logp = prox.clone().requires_grad_()
    loss, metrics = decoupled_ppo(logp, behav, adv, mask, prox_logprobs=prox, tis_cap=2.0, tis_mode="mask",
                                  tis_floor=0.5)
    loss.backward()
    assert loss.item() == pytest.approx(-0.5)
    assert torch.allclose(logp.grad, t([[-0.5, 0.0, 0.0]]))
    assert metrics["tis_weight_mean"] == pytest.approx(0.5) and metrics["tis_trunc_frac"] == pytest.approx(2 / 3)
    # truncate: weights 1.5, 2 (capped), 0 (under the floor) -> (-1.5 + 2) / 3, grad -0.5, 2/3, 0
    logp = prox.clone().requires_grad_()
    loss, metrics = decoupled_ppo(logp, behav, adv, mask, prox_logprobs=prox, tis_cap=2.0, tis_floor=0.5)
    loss.backward()
    assert loss.item() == pytest.approx(0.5 / 3)
    assert torch.allclose(logp.grad, t([[-0.5, 2 / 3, 0.0]]))
    with pytest.raises(ValueError, match=r"tis_mode='drop': must be one of \['mask', 'truncate'\]"):
        decoupled_ppo(logp, behav, adv, mask, tis_mode="drop")
    with pytest.raises(ValueError, match=r"tis_floor=1.5: must be in \[0, 1\)"):
        decoupled_ppo(logp, behav, adv, mask, tis_floor=1.5)
