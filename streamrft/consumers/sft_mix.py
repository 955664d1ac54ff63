"""Expert demonstrations mixed into every online RL step (`trainer.sft_mix`): CHORD.

Each optimiser update's loss is (1 - mu) * RL loss + mu * SFT loss, the SFT loss a token mean of
-log p over `rows_per_step` expert completions, with CHORD-phi each token's term weighted by
p (1 - p) (detached). mu follows CHORD's schedule (Zhang et al. 2025, "On-Policy RL Meets
Off-Policy Experts"; Trinity-RFT's `mix_chord`): linear warm-up to `mu_peak`, cosine decay to
`mu_valley`. Departure from Trinity: the expert rows are their own forward per update, not rows
of the RL batch, so the RL loss's token counts are the RL rows' alone. Rows are taken in file
order by step (step k: rows k*n .. k*n+n-1, wrapping), so a step redone after a crash sees the same.
"""
from __future__ import annotations

import math

import torch

from streamrft.consumers.offline_data import SeqBatch, collate_sequences, load_offline_dataset


def mu_schedule(step: int, warmup_steps: int, decay_steps: int, peak: float, valley: float) -> float:
    """CHORD's mu at `step`: step/warmup * peak while warming up, then cosine from peak to valley
    over `decay_steps`, then valley."""
    if step < warmup_steps:
        return step / warmup_steps * peak
    if step >= warmup_steps + decay_steps:
        return valley
    cosine = 0.5 * (1 + math.cos(math.pi * (step - warmup_steps) / decay_steps))
    return (peak - valley) * cosine + valley


def sft_loss(logp: torch.Tensor, mask: torch.Tensor, phi: bool) -> torch.Tensor:
    """Token mean of -log p over `mask`; with `phi` each term weighted by p (1 - p), detached."""
    terms = -logp
    if phi:
        p = logp.detach().exp()
        terms = terms * p * (1 - p)
    mask = mask.to(terms.dtype)
    return torch.where(mask > 0, terms, torch.zeros_like(terms)).sum() / mask.sum().clamp(min=1)


class SftSource:
    """The expert dataset, tokenised once, and the rows of each step."""

    def __init__(self, cfg, tokenizer):
        self.cfg = cfg
        data = load_offline_dataset(cfg.path, tokenizer)
        if data.shape not in ("sft", "chat"):
            raise ValueError(f"trainer.sft_mix.path={cfg.path!r} holds {data.shape!r} rows; expert demonstrations "
                             "are prompt/completion (sft) or messages (chat) rows")
        self.examples = data.examples
        self.pad_id = tokenizer.pad_token_id

    def batch(self, step: int) -> SeqBatch:
        n, k = len(self.examples), self.cfg.rows_per_step
        rows = [self.examples[(step * k + i) % n] for i in range(k)]
        return collate_sequences([(r.prompt_ids, r.completion_ids) for r in rows], self.pad_id)

    def mu(self, step: int) -> float:
        c = self.cfg
        return mu_schedule(step, c.mu_warmup_steps, c.mu_decay_steps, c.mu_peak, c.mu_valley)
