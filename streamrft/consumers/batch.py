"""Turn trajectories into padded training tensors and compute token log-probs under the policy.

Row b holds prompt + response, right-padded. Every tensor is `[B, L-1]`, aligned to the
predicted token: column t scores token t+1. `mask` is 1 on response tokens whose loss_mask is 1.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Batch:
    input_ids: torch.Tensor      # [B, L]
    attention_mask: torch.Tensor  # [B, L]
    mask: torch.Tensor           # [B, L-1] float
    old_logprobs: torch.Tensor   # [B, L-1]
    advantages: torch.Tensor     # [B]
    rewards: torch.Tensor        # [B]

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def slice(self, start: int, stop: int) -> "Batch":
        return Batch(*(getattr(self, f)[start:stop] for f in self.__dataclass_fields__))

    def to(self, device) -> "Batch":
        return Batch(*(getattr(self, f).to(device) for f in self.__dataclass_fields__))


def collate(samples: list[tuple], pad_id: int) -> Batch:
    """samples: (Trajectory, advantage, reward) tuples."""
    width = max(len(t.prompt_ids) + len(t.response_ids) for t, _, _ in samples)
    B = len(samples)
    ids = torch.full((B, width), pad_id, dtype=torch.long)
    attn = torch.zeros((B, width), dtype=torch.long)
    mask = torch.zeros((B, width - 1))
    old = torch.zeros((B, width - 1))
    for b, (t, _, _) in enumerate(samples):
        p, r = len(t.prompt_ids), len(t.response_ids)
        ids[b, : p + r] = torch.tensor(t.prompt_ids + t.response_ids)
        attn[b, : p + r] = 1
        mask[b, p - 1 : p - 1 + r] = torch.tensor(t.mask(), dtype=torch.float)
        old[b, p - 1 : p - 1 + r] = torch.tensor(t.logprobs)
    adv = torch.tensor([a for _, a, _ in samples], dtype=torch.float)
    rew = torch.tensor([r for _, _, r in samples], dtype=torch.float)
    return Batch(ids, attn, mask, old, adv, rew)


def token_logprobs(model, batch: Batch, temperature: float = 1.0, with_entropy: bool = False):
    """Log-prob of each next token under `model` at the explorers' sampling temperature."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1].float()
    if temperature not in (0.0, 1.0):
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, batch.input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    if not with_entropy:
        return logp, None
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy
