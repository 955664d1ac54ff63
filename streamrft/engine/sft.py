"""Supervised warm-up: causal-LM loss on completion tokens only (prompt and padding masked), AdamW.

The demo runs it as a stage before RL so the policy learns the answer format; it trains the
model in place and returns the loss of every step.
"""
from __future__ import annotations

import random

import torch


def _batch(tokenizer, pairs: list[tuple[str, str]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded input ids, attention mask and labels (-100 outside the completion + EOS)."""
    seqs, labels = [], []
    for prompt, completion in pairs:
        p = tokenizer(prompt).input_ids  # with the tokenizer's BOS, as at rollout time
        c = tokenizer(completion, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
        seqs.append(p + c)
        labels.append([-100] * len(p) + c)
    width = max(len(s) for s in seqs)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([s + [pad] * (width - len(s)) for s in seqs])
    mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
    lab = torch.tensor([l + [-100] * (width - len(l)) for l in labels])
    return ids, mask, lab


def sft_warmup(
    model: torch.nn.Module,
    tokenizer,
    pairs: list[tuple[str, str]],
    steps: int,
    batch_size: int = 16,
    lr: float = 1e-3,
    seed: int = 0,
    weight_decay: float = 0.0,
) -> list[float]:
    """Train `model` in place on (prompt, completion) pairs; returns the loss of each step.

    Batches are drawn with replacement by a `seed`ed RNG; the loss is the mean token cross-entropy
    over completion tokens (the EOS after each completion included, so the model learns to stop).
    """
    if not pairs:
        raise ValueError("no SFT pairs")
    rng = random.Random(seed)
    device = next(model.parameters()).device
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    was_training = model.training
    model.train()
    losses = []
    for _ in range(steps):
        ids, mask, lab = (t.to(device) for t in _batch(tokenizer, rng.choices(pairs, k=batch_size)))
        loss = model(input_ids=ids, attention_mask=mask, labels=lab).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.train(was_training)
    return losses
