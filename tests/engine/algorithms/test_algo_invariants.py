"""Micro-batching, extra padding and data-parallel splits change neither loss nor gradient.

Every aggregation mode, raw and inside the policy losses: each part is normalised by the
step's global token / sequence counts and the parts' losses are summed.
"""

import pytest
import torch

from streamrft.engine.algorithms import AGGREGATIONS, POLICY_LOSSES, aggregate

LENGTHS = torch.tensor([5, 3, 1, 4, 2, 3])
B, T, NORM_LEN = 6, 5, 8
LOSS_PARAMS = {
    "aggregate": {},
    "ppo": {"clip_low": 0.2, "clip_high": 0.28, "clip_c": 3.0},
    "gspo": {"clip_low": 0.05, "clip_high": 0.05},
    "cispo": {"clip_low": 0.2, "clip_high": 0.1},
    "decoupled_ppo": {"tis_cap": 1.2},
    "pg": {},
    "sft": {},
}
CASES = [(loss, mode) for loss in LOSS_PARAMS for mode in sorted(AGGREGATIONS)]


def make_batch():
    g = torch.Generator().manual_seed(0)
    logp = -2 * torch.rand(B, T, generator=g, dtype=torch.float64)
    old = logp + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    prox = logp + 0.2 * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = torch.arange(T)[None, :] < LENGTHS[:, None]
    return logp, old, prox, adv, mask


def loss_of(name, mode, logp, old, prox, adv, mask, **counts):
    if name == "aggregate":
        loss_mat = (logp - old).square() * adv + logp
        return aggregate(loss_mat, mask, mode, norm_len=NORM_LEN, **counts)
    params = dict(LOSS_PARAMS[name], agg_mode=mode, norm_len=NORM_LEN, **counts)
    if name == "decoupled_ppo":
        params["prox_logprobs"] = prox
    loss, _ = POLICY_LOSSES[name](logp, old, adv, mask, **params)
    return loss


def full_batch(name, mode):
    logp, old, prox, adv, mask = make_batch()
    leaf = logp.clone().requires_grad_()
    loss = loss_of(name, mode, leaf, old, prox, adv, mask)
    loss.backward()
    return loss.detach(), leaf.grad


def global_counts(mask):
    return {"global_tokens": int(mask.sum()), "global_seqs": int((mask.sum(-1) > 0).sum())}


@pytest.mark.parametrize("name,mode", CASES)
def test_micro_batches_sum_to_the_full_batch(name, mode):
    expected_loss, expected_grad = full_batch(name, mode)
    logp, old, prox, adv, mask = make_batch()
    leaf = logp.clone().requires_grad_()
    total = 0.0
    for rows in (slice(0, 1), slice(1, 4), slice(4, 6)):
        part = [x[rows] for x in (leaf, old, prox, adv, mask)]
        loss = loss_of(name, mode, *part, **global_counts(mask))
        loss.backward()  # gradient accumulation, no rescaling
        total += loss.item()
    assert total == pytest.approx(expected_loss.item(), abs=1e-12)
    assert torch.allclose(leaf.grad, expected_grad, atol=1e-12)


@pytest.mark.parametrize("name,mode", CASES)
def test_extra_padding_columns_and_rows_change_nothing(name, mode):
    expected_loss, expected_grad = full_batch(name, mode)
    logp, old, prox, adv, mask = make_batch()
    g = torch.Generator().manual_seed(1)

    def pad(x):
        wide = torch.cat([x, torch.randn(B, 3, generator=g, dtype=torch.float64)], dim=1)
        return torch.cat([wide, torch.randn(1, T + 3, generator=g, dtype=torch.float64)])

    padded_mask = torch.zeros(B + 1, T + 3, dtype=torch.bool)
    padded_mask[:B, :T] = mask
    leaf = pad(logp).requires_grad_()
    loss = loss_of(name, mode, leaf, pad(old), pad(prox), pad(adv), padded_mask)
    loss.backward()
    assert loss.item() == pytest.approx(expected_loss.item(), abs=1e-12)
    assert torch.allclose(leaf.grad[:B, :T], expected_grad, atol=1e-12)
    assert torch.count_nonzero(leaf.grad[B:]) == 0 and torch.count_nonzero(leaf.grad[:, T:]) == 0


@pytest.mark.parametrize("name,mode", CASES)
def test_rank_split_with_global_counts_sums_to_the_full_batch(name, mode):
    expected_loss, expected_grad = full_batch(name, mode)
    logp, old, prox, adv, mask = make_batch()
    # global counts as an all-reduce would deliver them: tensors
    counts = {k: torch.tensor(v) for k, v in global_counts(mask).items()}
    total, grads = 0.0, []
    for rows in (slice(0, 3), slice(3, 6)):
        # each rank trims its padding to its own longest sequence (widths 5 and 4)
        width = int(LENGTHS[rows].max())
        part = [x[rows, :width] for x in (logp, old, prox, adv, mask)]
        leaf = part[0].clone().requires_grad_()
        loss = loss_of(name, mode, leaf, *part[1:], **counts)
        loss.backward()
        total += loss.item()
        grads.append(torch.nn.functional.pad(leaf.grad, (0, T - width)))
    assert total == pytest.approx(expected_loss.item(), abs=1e-12)
    assert torch.allclose(torch.cat(grads), expected_grad, atol=1e-12)


def test_the_batch_exercises_clipping():
    # guards the invariants above against a batch where no clip branch is ever taken
    logp, old, _, adv, mask = make_batch()
    _, metrics = POLICY_LOSSES["ppo"](logp, old, adv, mask, **LOSS_PARAMS["ppo"])
    assert 0.0 < metrics["clip_frac"] < 1.0
    _, metrics = POLICY_LOSSES["gspo"](logp, old, adv, mask, **LOSS_PARAMS["gspo"])
    assert 0.0 < metrics["clip_frac"] < 1.0
    _, metrics = POLICY_LOSSES["cispo"](logp, old, adv, mask, **LOSS_PARAMS["cispo"])
    assert 0.0 < metrics["clip_frac"] < 1.0
