"""The critic's loss for PPO with a value model: clipped squared error to the GAE returns.

Pair it with `advantages.gae`, whose `returns` are the targets here.
"""

from __future__ import annotations

import torch

from .aggregation import Count, aggregate, masked_mean


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float | None = 0.2,
    agg_mode: str = "token-mean",
    global_tokens: Count = None,
    global_seqs: Count = None,
    norm_len: int | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped value loss, all inputs `[B, T]`; returns `(loss, metrics)`.

    loss_t = 0.5 * max((v - R)^2, (clip(v, v_old - clip, v_old + clip) - R)^2), aggregated
    like the policy loss (same global-count contract). `clip=None` gives the plain 0.5 * MSE.
    `old_values` (the critic at rollout time) and `returns` are detached. Metrics:
    vf_clip_frac (tokens where the clipped term is the larger), value_mean.
    """
    old_values, returns = old_values.detach(), returns.detach()
    unclipped = (values - returns).square()
    if clip is None:
        loss_mat, clip_frac = unclipped, torch.zeros_like(unclipped)
    else:
        clipped_values = torch.clamp(values, old_values - clip, old_values + clip)
        clipped = (clipped_values - returns).square()
        loss_mat, clip_frac = torch.maximum(unclipped, clipped), (clipped > unclipped).float()
    metrics = {
        "vf_clip_frac": masked_mean(clip_frac, mask),
        "value_mean": masked_mean(values, mask),
    }
    loss = 0.5 * aggregate(loss_mat, mask, agg_mode, global_tokens, global_seqs, norm_len)
    return loss, metrics
