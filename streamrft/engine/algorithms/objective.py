"""The trainer's one call per micro-batch: policy loss + KL penalty - entropy bonus.

Resolve the pieces once from the config (`resolve(POLICY_LOSSES, ...)`,
`resolve(KL_ESTIMATORS, ...)`), then call `policy_objective` for every micro-batch with the
global token and sequence counts of the optimiser step.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import torch

from .aggregation import Count, aggregate, masked_mean

PolicyLoss = Callable[..., tuple[torch.Tensor, dict[str, float]]]
KLEstimator = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

_AGG_KEYS = ("agg_mode", "global_tokens", "global_seqs", "norm_len")


def scale_gradient(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """`x` in the forward pass, `w * grad` in the backward (w broadcast over x)."""
    return x.detach() + w * (x - x.detach())


def policy_objective(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor | None,
    advantages: torch.Tensor | None,
    mask: torch.Tensor,
    ref_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    *,
    loss_fn: PolicyLoss,
    loss_params: Mapping[str, Any] | None = None,
    kl_fn: KLEstimator | None = None,
    kl_coef: float = 0.0,
    entropy_coef: float = 0.0,
    agg_mode: str = "token-mean",
    global_tokens: Count = None,
    global_seqs: Count = None,
    norm_len: int | None = None,
    sample_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """total = loss_fn(...) + kl_coef * agg(kl_fn(logprobs, ref)) - entropy_coef * agg(entropy).

    Tensors are `[B, T]` (advantages may be `[B]`): current log-probs (with grad), behaviour
    log-probs, advantages, mask, reference log-probs (needed when kl_coef != 0) and per-token
    entropy from `entropy_from_logits` (with grad; needed when entropy_coef != 0).
    `loss_fn` is a POLICY_LOSSES function and `loss_params` its own keyword arguments (clip
    bounds, `prox_logprobs`, ...); the aggregation arguments are passed here, once, and apply
    to all three terms alike (the global-count contract of `aggregation.aggregate`: sum the
    returned losses over micro-batches and ranks). `kl_fn` is a KL_ESTIMATORS function.
    Metrics: the loss's own, plus policy_loss and loss (this micro-batch's share; sum them over
    micro-batches), kl and entropy (masked means over this micro-batch) when used.
    `sample_weights` `[B]` (prioritised replay's importance weights) scale each row's gradient, so the
    gradient is that of sum_b w_b * loss_b (every aggregation is a sum of per-row terms over global
    counts); forward values, so clip ratios, metrics and the reported loss, are the unweighted ones.
    """
    params = dict(loss_params or {})
    if sample_weights is not None:
        w = sample_weights.to(logprobs.dtype).unsqueeze(-1)
        logprobs = scale_gradient(logprobs, w)
        entropy = None if entropy is None else scale_gradient(entropy, w)
    clash = [key for key in _AGG_KEYS if key in params]
    if clash:
        raise ValueError(f"pass {clash} to policy_objective directly, not in loss_params")
    agg = {
        "agg_mode": agg_mode,
        "global_tokens": global_tokens,
        "global_seqs": global_seqs,
        "norm_len": norm_len,
    }
    policy_loss, metrics = loss_fn(logprobs, old_logprobs, advantages, mask, **params, **agg)
    metrics = dict(metrics)
    metrics["policy_loss"] = float(policy_loss.detach())
    total = policy_loss
    if kl_coef != 0.0 and (kl_fn is None or ref_logprobs is None):
        raise ValueError("kl_coef != 0 needs both kl_fn and ref_logprobs")
    if kl_fn is not None and ref_logprobs is not None:
        kl = kl_fn(logprobs, ref_logprobs.detach())
        metrics["kl"] = masked_mean(kl, mask)
        if kl_coef != 0.0:
            kl_term = aggregate(kl, mask, agg_mode, global_tokens, global_seqs, norm_len)
            total = total + kl_coef * kl_term
    if entropy_coef != 0.0 and entropy is None:
        raise ValueError("entropy_coef != 0 needs the per-token entropy")
    if entropy is not None:
        metrics["entropy"] = masked_mean(entropy, mask)
        if entropy_coef != 0.0:
            entropy_term = aggregate(entropy, mask, agg_mode, global_tokens, global_seqs, norm_len)
            total = total - entropy_coef * entropy_term
    metrics["loss"] = float(total.detach())
    return total, metrics
