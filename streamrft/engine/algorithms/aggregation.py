"""Reduce a `[batch, tokens]` loss matrix to the scalar of one micro-batch's share of a step.

Every mode divides by a count of the WHOLE optimiser step (all micro-batches on all ranks),
passed in as `global_tokens` / `global_seqs`, so the per-micro-batch losses are partial sums:
add them up (accumulate gradients without rescaling) and you get the full-batch loss and
gradient exactly. Add a mode by writing one function with the shared signature below.
"""

from __future__ import annotations

import torch

from .registry import resolve

Count = int | float | torch.Tensor | None


def _masked(loss_mat: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    mask = mask.to(loss_mat.dtype)
    # where, not multiply: a NaN/inf sitting on a padded position must not leak into the sum
    return torch.where(mask > 0, loss_mat, torch.zeros_like(loss_mat)), mask


def _seq_count(mask: torch.Tensor) -> torch.Tensor:
    # rows with no valid token are padding rows: they are not sequences
    return (mask.sum(-1) > 0).sum()


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean of `x` over the valid positions of `mask`, detached, as a python float (metrics)."""
    masked, mask = _masked(x.detach(), mask)
    return float(masked.sum() / mask.sum().clamp(min=1))


def _divide(total: torch.Tensor, count: Count, local: torch.Tensor) -> torch.Tensor:
    denominator = local if count is None else count
    if isinstance(denominator, torch.Tensor):
        return total / denominator.to(total.dtype).clamp(min=1)
    return total / max(float(denominator), 1.0)


def token_mean(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    *,
    global_tokens: Count = None,
    global_seqs: Count = None,
    norm_len: int | None = None,
) -> torch.Tensor:
    """sum of valid-token losses / global_tokens (default: this mask's token count).

    Every token of the step weighs the same (DAPO); long sequences weigh more.
    """
    masked, mask = _masked(loss_mat, mask)
    return _divide(masked.sum(), global_tokens, mask.sum())


def seq_mean_token_sum(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    *,
    global_tokens: Count = None,
    global_seqs: Count = None,
    norm_len: int | None = None,
) -> torch.Tensor:
    """sum over sequences of (sum of the sequence's token losses) / global_seqs.

    Also the reduction for per-example offline losses: pass them as `[batch, 1]` with a
    ones mask.
    """
    masked, mask = _masked(loss_mat, mask)
    return _divide(masked.sum(), global_seqs, _seq_count(mask))


def seq_mean_token_mean(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    *,
    global_tokens: Count = None,
    global_seqs: Count = None,
    norm_len: int | None = None,
) -> torch.Tensor:
    """sum over sequences of (mean of the sequence's token losses) / global_seqs.

    The original GRPO objective. The global count here is SEQUENCES, not tokens: each
    sequence's token mean is complete within its row, so only the outer mean spans ranks.
    """
    masked, mask = _masked(loss_mat, mask)
    per_seq = masked.sum(-1) / mask.sum(-1).clamp(min=1)
    return _divide(per_seq.sum(), global_seqs, _seq_count(mask))


def seq_mean_token_sum_norm(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    *,
    global_tokens: Count = None,
    global_seqs: Count = None,
    norm_len: int | None = None,
) -> torch.Tensor:
    """sum of valid-token losses / (norm_len * global_seqs): Dr.GRPO's constant normaliser.

    `norm_len` (e.g. the run's max response length) is required: defaulting it to the padded
    width would make the loss depend on how a micro-batch happens to be padded. Departs from
    verl, which divides by the padded width only and not by the sequence count; this follows
    the Dr.GRPO paper's 1/G * 1/MAX_TOKENS.
    """
    if norm_len is None:
        raise ValueError("aggregation 'seq-mean-token-sum-norm' needs norm_len (a constant length)")
    masked, mask = _masked(loss_mat, mask)
    return _divide(masked.sum() / float(norm_len), global_seqs, _seq_count(mask))


AGGREGATIONS = {
    "token-mean": token_mean,
    "seq-mean-token-sum": seq_mean_token_sum,
    "seq-mean-token-mean": seq_mean_token_mean,
    "seq-mean-token-sum-norm": seq_mean_token_sum_norm,
}


def aggregate(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token-mean",
    global_tokens: Count = None,
    global_seqs: Count = None,
    norm_len: int | None = None,
) -> torch.Tensor:
    """Reduce `loss_mat` `[B, T]` under `mask` `[B, T]` (bool or 0/1) to a scalar.

    Contract: `global_tokens` is the number of valid tokens and `global_seqs` the number of
    sequences with at least one valid token in the WHOLE optimiser step, i.e. over every
    micro-batch of every data-parallel rank (token-mean uses tokens; all seq-* modes,
    seq-mean-token-mean included, use sequences). Left as None they default to this call's
    own counts, which is right only when the call sees the whole step. With the global counts,
    summing the returned losses over micro-batches and ranks reproduces the full-batch loss
    and gradient exactly; so accumulate gradients without dividing by the number of
    micro-batches, and under DDP (which AVERAGES gradients over ranks) multiply the loss by the
    world size, or all-reduce with SUM. Extra fully-masked columns or rows change nothing.
    Masked positions may hold any finite value.
    """
    fn = resolve(AGGREGATIONS, mode)
    return fn(
        loss_mat, mask, global_tokens=global_tokens, global_seqs=global_seqs, norm_len=norm_len
    )
