"""Per-token KL(policy || reference) estimators (Schulman's k1/k2/k3) and the entropy bonus.

Each estimator is `fn(logprobs, ref_logprobs) -> [B, T]` on the sampled tokens; aggregate it
as a loss term with `aggregation.aggregate`, or subtract it from the rewards with
`kl_penalty_rewards`. Add an estimator by writing one more such function.
"""

from __future__ import annotations

import torch


def k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """log p - log q per token `[B, T]`. Unbiased for KL(p||q) under samples of p; can be < 0."""
    return logprobs - ref_logprobs


def k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """0.5 * (log p - log q)^2 per token `[B, T]`: biased, low variance, always >= 0.

    Its gradient is that of the reverse KL on-policy (GRPO-style KL loss on sampled tokens).
    """
    return 0.5 * (logprobs - ref_logprobs).square()


def k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """q/p - 1 - log(q/p) per token `[B, T]`: unbiased and >= 0 (the GRPO paper's KL term)."""
    log_ratio = ref_logprobs - logprobs
    return torch.exp(log_ratio) - log_ratio - 1.0


def low_var_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k3 made safe as verl does: log(q/p) clamped to [-20, 20], then the result to [-10, 10].

    Shapes `[B, T]`. The clamps bias the estimate only where the policy has drifted far.
    """
    log_ratio = torch.clamp(ref_logprobs - logprobs, min=-20.0, max=20.0)
    return torch.clamp(torch.exp(log_ratio) - log_ratio - 1.0, min=-10.0, max=10.0)


def kl_penalty_rewards(
    rewards_per_token: torch.Tensor,
    kl: torch.Tensor,
    coef: float,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """rewards - coef * kl, per token `[B, T]`, KL as a reward penalty (PPO/REINFORCE++ style).

    `kl` comes from one of the estimators above and is detached: as a reward it carries no
    gradient. With `mask`, padded positions are zeroed.
    """
    shaped = rewards_per_token - coef * kl.detach()
    return shaped if mask is None else shaped * mask.to(shaped.dtype)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last (vocabulary) axis: `[B, T, V] -> [B, T]`.

    Computed as logsumexp(z) - sum softmax(z) * z, which never takes the log of a probability.
    Keeps its gradient, so `-coef * aggregate(entropy)` acts as an entropy bonus.
    """
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(-1)
