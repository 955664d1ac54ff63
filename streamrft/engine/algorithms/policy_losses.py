"""Policy losses: `fn(logprobs, old_logprobs, advantages, mask, **params) -> (loss, metrics)`.

Tensors are `[B, T]` log-probs of the sampled tokens (advantages may also be `[B]`, one per
sequence). `loss` is a scalar already aggregated with `agg_mode` / `global_tokens` /
`global_seqs` / `norm_len` (see `aggregation.aggregate` for the micro-batch contract);
`metrics` are python floats, masked means over this micro-batch. Add a loss by writing one
function with this signature and naming it in `POLICY_LOSSES` (or via `import_path`).
"""

from __future__ import annotations

import math

import torch

from .aggregation import Count, aggregate, masked_mean
from .offline import sft_loss

# exp() of a log-ratio beyond this is numerically meaningless; verl clamps the same way
_MAX_LOG_RATIO = 20.0


def _token_advantages(advantages: torch.Tensor, logprobs: torch.Tensor) -> torch.Tensor:
    advantages = advantages.detach().to(logprobs.dtype)
    return advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages


def _clipped_surrogate(
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    clip_c: float | None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token PPO loss max(-A r, -A clip(r, 1-clip_low, 1+clip_high)), dual-clipped."""
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    metrics = {"clip_frac": masked_mean((clipped > unclipped).to(ratio.dtype), mask)}
    if clip_c is not None:
        # dual clip (Ye et al. 2020, as verl): for A < 0 the loss is capped at -A * clip_c,
        # so a token whose ratio exploded cannot dominate the step
        capped = torch.minimum(loss, -advantages * clip_c)
        negative = advantages < 0
        capped_lower = (loss > capped) & negative
        metrics["clip_frac_lower"] = masked_mean(capped_lower.to(ratio.dtype), mask)
        loss = torch.where(negative, capped, loss)
    metrics["ratio_mean"] = masked_mean(ratio, mask)
    return loss, metrics


def _band_mask(log_w: torch.Tensor, mask: torch.Tensor, band: float | None, name: str,
               metrics: dict[str, float]) -> torch.Tensor:
    """1 where the weight exp(log_w) is inside [1/band, band], else 0 (None: 1 everywhere); the masked
    share of scored tokens goes to `metrics[name]`."""
    if band is None:
        return torch.ones_like(log_w)
    if not band > 1:
        raise ValueError(f"algorithm.policy_loss.params.{name.removesuffix('_frac')}={band}: must be > 1")
    inside = (log_w.abs() <= math.log(band)).to(log_w.dtype)
    metrics[name] = masked_mean(1 - inside, mask)
    return inside


def ppo(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_c: float | None = None,
    iw_band: float | None = None,
    agg_mode: str = "token-mean",
    global_tokens: Count = None,
    global_seqs: Count = None,
    norm_len: int | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate with asymmetric bounds (clip-higher, DAPO), optional dual clip and
    optional masking of tokens whose ratio leaves a band.

    ratio = exp(logprobs - old_logprobs), log-ratio clamped to +-20. The clip bounds the gradient
    of a positive-advantage token above 1 + clip_high and of a negative one below 1 - clip_low, but
    leaves a negative-advantage token's ratio unbounded above: on stale data (old = the behaviour
    policy) that is where one token can dominate a step. `clip_c` (> 1; verl uses 3.0) caps the
    loss of negative-advantage tokens at -A * clip_c; None disables it. `iw_band` (> 1) drops
    tokens whose ratio is outside [1/iw_band, iw_band] from the loss (they still count in its
    denominator, as AReaL's behaviour-weight cap and ICE-POP do); None keeps every token.
    Metrics: clip_frac, clip_frac_lower (with clip_c), iw_band_frac (with iw_band), ratio_mean,
    approx_kl (mean old - new).
    """
    adv = _token_advantages(advantages, logprobs)
    log_ratio = torch.clamp(logprobs - old_logprobs.detach(), -_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    loss_mat, metrics = _clipped_surrogate(log_ratio, adv, mask, clip_low, clip_high, clip_c)
    loss_mat = loss_mat * _band_mask(log_ratio.detach(), mask, iw_band, "iw_band_frac", metrics)
    metrics["approx_kl"] = masked_mean(-log_ratio, mask)
    loss = aggregate(loss_mat, mask, agg_mode, global_tokens, global_seqs, norm_len)
    return loss, metrics


def decoupled_ppo(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    prox_logprobs: torch.Tensor | None = None,
    tis_cap: float = 2.0,
    tis_mode: str = "truncate",
    tis_floor: float | None = None,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_c: float | None = None,
    agg_mode: str = "token-mean",
    global_tokens: Count = None,
    global_seqs: Count = None,
    norm_len: int | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Decoupled PPO for stale (off-policy) data, with a truncated importance weight.

    `old_logprobs` are the BEHAVIOUR policy's (the explorer's, from the trajectory);
    `prox_logprobs` `[B, T]` the proximal policy's (the trainer's weights before this step,
    recomputed); None means prox = behaviour, which reduces this to PPO. The PPO term is
    clipped against prox and multiplied by the behaviour weight w = exp(prox - behav), detached
    and bounded: `tis_mode` "truncate" uses min(w, tis_cap) (truncated IS); "mask" drops the
    tokens whose w exceeds tis_cap (AReaL's `behave_imp_weight_cap`). `tis_floor` (< 1) also
    drops the tokens whose w is below it (ICE-POP's band); None keeps them. Dropped tokens still
    count in the loss's denominator. Metrics: ppo's plus tis_weight_mean (of the weights applied)
    and tis_trunc_frac (tokens truncated or dropped above the cap; below the floor too).
    """
    if tis_mode not in ("truncate", "mask"):
        raise ValueError(f"algorithm.policy_loss.params.tis_mode={tis_mode!r}: must be one of ['mask', 'truncate']")
    if tis_floor is not None and not 0 <= tis_floor < 1:
        raise ValueError(f"algorithm.policy_loss.params.tis_floor={tis_floor}: must be in [0, 1)")
    prox = (old_logprobs if prox_logprobs is None else prox_logprobs).detach()
    adv = _token_advantages(advantages, logprobs)
    log_ratio = torch.clamp(logprobs - prox, -_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    loss_mat, metrics = _clipped_surrogate(log_ratio, adv, mask, clip_low, clip_high, clip_c)
    behav_log_w = torch.clamp(prox - old_logprobs, -_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    raw_weight = torch.exp(behav_log_w).detach()
    above = raw_weight > tis_cap
    below = raw_weight < tis_floor if tis_floor is not None else torch.zeros_like(above)
    out_of_band = above | below
    # mask: drop every token out of the band; truncate: cap the weight, drop what is below the floor
    weight = raw_weight if tis_mode == "mask" else torch.clamp(raw_weight, max=tis_cap)
    weight = torch.where(out_of_band if tis_mode == "mask" else below, torch.zeros_like(weight), weight)
    metrics["approx_kl"] = masked_mean(-log_ratio, mask)
    metrics["tis_weight_mean"] = masked_mean(weight, mask)
    metrics["tis_trunc_frac"] = masked_mean(out_of_band.to(weight.dtype), mask)
    loss = aggregate(weight * loss_mat, mask, agg_mode, global_tokens, global_seqs, norm_len)
    return loss, metrics


def gspo(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    agg_mode: str = "seq-mean-token-mean",
    global_tokens: Count = None,
    global_seqs: Count = None,
    norm_len: int | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO: one importance ratio per sequence, exp(mean over its valid tokens of log-ratio).

    The ratio is clipped at sequence level (paper defaults 3e-4 / 4e-4) and broadcast to the
    tokens in the GSPO-token form, sg(s_i) * pi_t / sg(pi_t): its value is the sequence
    ratio, and with one advantage per sequence and 'seq-mean-token-mean' its gradient is the
    paper's sequence-level one; per-token advantages are allowed too. No dual clip.
    Metrics: clip_frac (over tokens), ratio_mean, approx_kl.
    """
    adv = _token_advantages(advantages, logprobs)
    m = mask.to(logprobs.dtype)
    token_log_ratio = logprobs - old_logprobs.detach()
    token_log_ratio = torch.where(m > 0, token_log_ratio, torch.zeros_like(token_log_ratio))
    seq_log_ratio = token_log_ratio.sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1)
    log_ratio = logprobs - logprobs.detach() + seq_log_ratio.detach()
    log_ratio = torch.clamp(log_ratio, -_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    loss_mat, metrics = _clipped_surrogate(log_ratio, adv, mask, clip_low, clip_high, None)
    metrics["approx_kl"] = masked_mean(-token_log_ratio, mask)
    loss = aggregate(loss_mat, mask, agg_mode, global_tokens, global_seqs, norm_len)
    return loss, metrics


def cispo(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float | None = None,
    clip_high: float = 0.28,
    agg_mode: str = "token-mean",
    global_tokens: Count = None,
    global_seqs: Count = None,
    norm_len: int | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO (MiniMax-M1): loss = -sg(clip(r, 1 - clip_low, 1 + clip_high)) * A * logprobs.

    Every token keeps a gradient; only its importance weight is clipped. `clip_low=None`
    sets no lower bound, as the paper does. Metrics: clip_frac, ratio_mean, approx_kl.
    """
    adv = _token_advantages(advantages, logprobs)
    log_ratio = torch.clamp(logprobs - old_logprobs, -_MAX_LOG_RATIO, _MAX_LOG_RATIO).detach()
    ratio = torch.exp(log_ratio)
    lower = None if clip_low is None else 1.0 - clip_low
    weight = torch.clamp(ratio, min=lower, max=1.0 + clip_high)
    loss_mat = -weight * adv * logprobs
    metrics = {
        "clip_frac": masked_mean((weight != ratio).to(ratio.dtype), mask),
        "ratio_mean": masked_mean(ratio, mask),
        "approx_kl": masked_mean(-log_ratio, mask),
    }
    return aggregate(loss_mat, mask, agg_mode, global_tokens, global_seqs, norm_len), metrics


def pg(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    agg_mode: str = "token-mean",
    global_tokens: Count = None,
    global_seqs: Count = None,
    norm_len: int | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Vanilla on-policy policy gradient (REINFORCE): gradient -A * grad(logprobs).

    Written as -A * exp(logprobs - sg(logprobs)), so the loss VALUE is -A (as PPO's at ratio
    1) rather than -A * logprobs; the gradient is the same. Ignores `old_logprobs`: no
    off-policy correction. Metrics: advantage_mean.
    """
    adv = _token_advantages(advantages, logprobs)
    loss_mat = -adv * torch.exp(logprobs - logprobs.detach())
    metrics = {"advantage_mean": masked_mean(adv.expand_as(logprobs), mask)}
    return aggregate(loss_mat, mask, agg_mode, global_tokens, global_seqs, norm_len), metrics


def sft(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor | None,
    advantages: torch.Tensor | None,
    mask: torch.Tensor,
    *,
    agg_mode: str = "token-mean",
    global_tokens: Count = None,
    global_seqs: Count = None,
    norm_len: int | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Supervised NLL of the masked tokens in the policy-loss signature (ignores
    `old_logprobs` and `advantages`, which may be None). Metrics: nll (token mean)."""
    loss = sft_loss(logprobs, mask, agg_mode, global_tokens, global_seqs, norm_len)
    return loss, {"nll": masked_mean(-logprobs, mask)}
