"""Advantage estimators: group-relative (GRPO, Dr.GRPO, RLOO, OPMD), batch-level (REINFORCE++),
token-level (GAE with a value model, on-policy distillation) and multi-turn step broadcast.

Group-level functions take the rewards of ONE group (the n samples of one task; a 1-D tensor
or a list) and return a 1-D tensor, so stream ops can run them per message. The rest need the
whole batch or token-level tensors and run in the trainer.
"""

from __future__ import annotations

from typing import Sequence

import torch

Rewards = torch.Tensor | Sequence[float]


def _as_float(rewards: Rewards) -> torch.Tensor:
    if isinstance(rewards, torch.Tensor) and rewards.is_floating_point():
        return rewards
    return torch.as_tensor(rewards, dtype=torch.get_default_dtype())


def grpo(rewards: Rewards, eps: float = 1e-6, unbiased: bool = True) -> torch.Tensor:
    """(r - mean) / (std + eps) over one group `[n] -> [n]`.

    `unbiased=True` (Bessel's n-1, as verl and TRL use torch.std) or False (population std).
    A group of one sample, or with equal rewards, gets zeros.
    """
    r = _as_float(rewards)
    if r.numel() < 2:
        return torch.zeros_like(r)
    return (r - r.mean()) / (r.std(correction=1 if unbiased else 0) + eps)


def dr_grpo(rewards: Rewards) -> torch.Tensor:
    """r - mean over one group `[n] -> [n]`: Dr.GRPO drops GRPO's std division.

    Dr.GRPO's other fix, no per-sequence length normalisation, is not an advantage: choose the
    aggregation 'seq-mean-token-sum-norm' (a constant normaliser) for it.
    """
    r = _as_float(rewards)
    return r - r.mean()


def rloo(rewards: Rewards) -> torch.Tensor:
    """Leave-one-out baseline over one group `[n] -> [n]`: r_i - mean_{j != i} r_j.

    Equals n / (n - 1) * (r_i - mean). A group of one sample has no baseline: zeros.
    """
    r = _as_float(rewards)
    n = r.numel()
    if n < 2:
        return torch.zeros_like(r)
    return (r * n - r.sum()) / (n - 1)


def opmd(rewards: Rewards, tau: float | None = None) -> torch.Tensor:
    """OPMD-style baseline over one group `[n] -> [n]`: r - mean, never divided by a std.

    With `tau`, the baseline is tau * log(mean(exp(r / tau))) (the soft, log-mean-exp form of
    online policy mirror descent, as Trinity-RFT offers); tau=None is the plain mean.
    """
    r = _as_float(rewards)
    if tau is None:
        return r - r.mean()
    log_mean_exp = torch.logsumexp(r / tau, dim=0) - torch.log(torch.tensor(float(r.numel())))
    return r - tau * log_mean_exp


def reinforce_pp(
    rewards: torch.Tensor,
    mask: torch.Tensor | None = None,
    gamma: float = 1.0,
    eps: float = 1e-8,
) -> torch.Tensor:
    """REINFORCE++: whiten returns over the WHOLE batch (not per group).

    `rewards` `[B]` (one reward per sequence): (r - mean) / (std + eps) over the batch.
    `rewards` `[B, T]` token-level (e.g. after `kl_penalty_rewards`) with `mask` `[B, T]`: the
    discounted return-to-go of every valid token, whitened over the valid tokens, zero on padding.
    Std is unbiased (as verl's masked_whiten). Departs from the paper only in that the KL
    penalty is applied by the caller, not here.
    """
    r = _as_float(rewards)
    if r.dim() == 1:
        if r.numel() < 2:
            return torch.zeros_like(r)
        return (r - r.mean()) / (r.std() + eps)
    if mask is None:
        mask = torch.ones_like(r)
    m = mask.to(r.dtype)
    returns = torch.zeros_like(r)
    running = torch.zeros_like(r[:, 0])
    for t in reversed(range(r.shape[1])):
        # a masked position passes the running return through untouched
        running = torch.where(m[:, t] > 0, r[:, t] + gamma * running, running)
        returns[:, t] = running
    count = m.sum()
    mean = (returns * m).sum() / count
    var = ((returns - mean).square() * m).sum() / (count - 1).clamp(min=1)
    return (returns - mean) / (var.sqrt() + eps) * m


def gae(
    rewards_per_token: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation for PPO with a critic.

    Inputs `[B, T]`: token rewards (usually the outcome reward on the last valid token, minus
    a KL penalty), critic values V(s_t), and the mask of the policy's tokens. Returns
    `(advantages, returns)`, both `[B, T]`, zero where masked; returns = advantages + values
    are the critic's targets. Masked positions (padding, or environment tokens inside a
    multi-turn sequence) are skipped: the recursion links each valid token to the next valid
    one, and rewards placed on masked positions are ignored. Departs from verl in not
    whitening the advantages; whiten them in the trainer if wanted.
    """
    m = mask.to(values.dtype)
    advantages = torch.zeros_like(values)
    next_value = torch.zeros_like(values[:, 0])
    last_gae = torch.zeros_like(values[:, 0])
    for t in reversed(range(values.shape[1])):
        valid = m[:, t] > 0
        delta = rewards_per_token[:, t] + gamma * next_value - values[:, t]
        gae_t = delta + gamma * lam * last_gae
        advantages[:, t] = torch.where(valid, gae_t, torch.zeros_like(gae_t))
        next_value = torch.where(valid, values[:, t], next_value)
        last_gae = torch.where(valid, gae_t, last_gae)
    return advantages, (advantages + values) * m


def broadcast_to_steps(
    run_advantages: torch.Tensor, steps_per_run: Sequence[int] | torch.Tensor
) -> torch.Tensor:
    """Give every step of a multi-turn run its run's advantage: `[R]` -> `[sum(steps_per_run)]`.

    Runs are in order and step s of run i lands at offset sum(steps_per_run[:i]) + s. The
    advantage is computed per run (e.g. `grpo` on the runs' final rewards) and copied to each
    step, the step-wise GRPO of Trinity-RFT; no per-step credit assignment is attempted.
    """
    counts = torch.as_tensor(steps_per_run, dtype=torch.long, device=run_advantages.device)
    if counts.numel() != run_advantages.numel():
        raise ValueError(
            f"{run_advantages.numel()} run advantages but {counts.numel()} step counts"
        )
    return torch.repeat_interleave(run_advantages, counts)


def opd(
    teacher_logprobs: torch.Tensor, student_logprobs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """On-policy distillation's per-token advantage `[B, T]`: teacher_logp - student_logp.

    Both are the log-probs of the tokens the student sampled; the result is minus the
    per-token reverse-KL estimate, detached and zero where masked. Use it as token-level
    advantages with a policy loss ('ppo'). Like Thinking Machines' recipe it uses no discount
    over future tokens (each token's advantage is its own term only).
    """
    diff = (teacher_logprobs - student_logprobs).detach()
    return torch.where(mask > 0, diff, torch.zeros_like(diff))
