"""A trust region on one optimiser step (`trainer.max_update_kl`): TRPO's line search, applied to
whatever step the optimiser took.

After a step, the KL from the batch-start policy p to the new policy q is estimated on the batch's
sampled tokens with k3 (`kl.k3`: exp(log q - log p) - (log q - log p) - 1, unbiased for KL(p||q)
under samples of p; the batch was sampled by the behaviour policy, at most `max_staleness`
versions before p). If it exceeds the bound, the step is scaled back along its own direction,
w0 + a (w1 - w0). For small steps the KL grows as a^2, so the next scale aims at 80 % of the bound
from the last measurement.
"""
from __future__ import annotations

import math

import torch

from streamrft.engine.algorithms.kl import k3

TARGET = 0.8
"""A scale-back aims at this share of the bound (the KL is only about quadratic in the scale)."""
MAX_SCALE_BACKS = 4


def step_kl(start_logprobs: torch.Tensor, new_logprobs: torch.Tensor, mask: torch.Tensor) -> float:
    """KL(start || new) per sampled token: k3's mean over `mask`'s tokens (shapes `[B, T]`)."""
    per_token = k3(start_logprobs.float(), new_logprobs.float()) * mask
    return float(per_token.sum() / mask.sum().clamp(min=1))


def next_scale(scale: float, kl: float, bound: float) -> float:
    """The step's next scale after measuring `kl` (> `bound`) at `scale`: KL ~ scale^2, aimed at
    `TARGET` x `bound`."""
    if not kl > bound:
        raise ValueError(f"next_scale: the KL {kl} is within the bound {bound}")
    return scale * math.sqrt(TARGET * bound / kl)


@torch.no_grad()
def set_scale(params: list[torch.Tensor], before: list[torch.Tensor], after: list[torch.Tensor], scale: float) -> None:
    """Each parameter to `before + scale * (after - before)` (scale 0: before; 1: after)."""
    for p, b, a in zip(params, before, after):
        p.copy_(torch.lerp(b.to(p.dtype), a.to(p.dtype), scale))
