"""Offline losses: DPO (sigmoid, conservative label smoothing), KTO and SFT.

DPO and KTO return PER-EXAMPLE losses `[N]` computed from sequence log-probs (see
`sequence_logps`); reduce them with `aggregate(losses[:, None], ones, "seq-mean-token-sum",
global_seqs=...)` so micro-batches sum to the batch mean. They have their own signatures, so
they live in `OFFLINE_LOSSES`, not in `POLICY_LOSSES`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .aggregation import Count, aggregate


def sequence_logps(token_logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum of the masked per-token log-probs of each sequence: `[B, T] -> [B]`.

    Sums within a row only, never over the batch; masked positions may hold any finite value.
    """
    return torch.where(mask > 0, token_logps, torch.zeros_like(token_logps)).sum(-1)


def dpo_loss(
    chosen_logps: torch.Tensor,
    rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    beta: float = 0.1,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """Sigmoid DPO per pair: all inputs `[P]` sequence log-probs, returns `[P]`.

    z = beta * ((chosen - rejected) - (ref_chosen - ref_rejected));
    loss = -(1 - ls) * log sigmoid(z) - ls * log sigmoid(-z), the conservative DPO (cDPO)
    form of label smoothing, as TRL's "sigmoid" loss. Reference log-probs are detached.
    """
    logits = (chosen_logps - rejected_logps) - (ref_chosen_logps - ref_rejected_logps).detach()
    z = beta * logits
    return -(1.0 - label_smoothing) * F.logsigmoid(z) - label_smoothing * F.logsigmoid(-z)


def dpo_metrics(
    chosen_logps: torch.Tensor,
    rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    beta: float = 0.1,
) -> dict[str, float]:
    """DPO's implicit rewards beta * (logp - ref_logp), averaged over the `[P]` pairs:
    reward_chosen, reward_rejected, reward_margin and reward_accuracy (chosen > rejected)."""
    chosen = (beta * (chosen_logps - ref_chosen_logps)).detach()
    rejected = (beta * (rejected_logps - ref_rejected_logps)).detach()
    return {
        "reward_chosen": float(chosen.mean()),
        "reward_rejected": float(rejected.mean()),
        "reward_margin": float((chosen - rejected).mean()),
        "reward_accuracy": float((chosen > rejected).float().mean()),
    }


def kto_kl_ref(policy_kl_logps: torch.Tensor, ref_kl_logps: torch.Tensor) -> torch.Tensor:
    """KTO's reference point z0: mean over `[N]` of policy - reference sequence log-probs,
    detached and clamped at 0. As in TRL the log-probs are of MISMATCHED pairs (prompt i
    with completion j != i); across ranks, average the per-rank means before clamping."""
    return (policy_kl_logps - ref_kl_logps).mean().clamp(min=0).detach()


def kto_loss(
    policy_logps: torch.Tensor,
    ref_logps: torch.Tensor,
    labels: torch.Tensor,
    kl_ref: torch.Tensor | float,
    beta: float = 0.1,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
) -> torch.Tensor:
    """KTO per example: `[N]` sequence log-probs and bool `labels` (True = desirable) -> `[N]`.

    With r = policy - ref and z0 = kl_ref (detached, clamped >= 0 here again):
    desirable: w_d * (1 - sigmoid(beta * (r - z0))); undesirable: w_u * (1 - sigmoid(beta *
    (z0 - r))), as the KTO paper and TRL. TRL averages the concatenated chosen and rejected
    losses, which is the mean of these per-example values.
    """
    z0 = torch.as_tensor(kl_ref, dtype=policy_logps.dtype, device=policy_logps.device)
    z0 = z0.detach().clamp(min=0)
    logratio = policy_logps - ref_logps.detach()
    desirable = desirable_weight * (1.0 - torch.sigmoid(beta * (logratio - z0)))
    undesirable = undesirable_weight * (1.0 - torch.sigmoid(beta * (z0 - logratio)))
    return torch.where(labels.bool(), desirable, undesirable)


def sft_loss(
    logprobs: torch.Tensor,
    mask: torch.Tensor,
    agg_mode: str = "token-mean",
    global_tokens: Count = None,
    global_seqs: Count = None,
    norm_len: int | None = None,
) -> torch.Tensor:
    """Negative log-likelihood of the masked tokens: `[B, T]` -> scalar, aggregated (token
    mean by default) under the same global-count contract as `aggregation.aggregate`."""
    return aggregate(-logprobs, mask, agg_mode, global_tokens, global_seqs, norm_len)
