"""Supervised warm-up: causal-LM loss on completion tokens only (prompt and padding masked), AdamW.

The demo runs it as a stage before RL so the policy learns the answer format; it trains the
model in place and returns the loss of every step.
"""
from __future__ import annotations

import math
import random
from typing import Callable

import torch


Sequence = tuple[list[int], list[int]] | tuple[list[int], list[int], torch.Tensor]
"""Token ids and a 0/1 mask of the tokens to learn (the rest only conditions); a vision-language
model's also the pixel values ([k, C, H, W]) of the k images whose placeholders the ids hold."""


def pair_sequence(tokenizer, prompt: str, completion: str) -> Sequence:
    """A (prompt, completion) pair as ids: prompt with the tokenizer's BOS, as at rollout time,
    then the completion and EOS, which alone are learned."""
    p = tokenizer(prompt).input_ids
    c = tokenizer(completion, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
    return p + c, [0] * len(p) + [1] * len(c)


def image_pair_sequence(processor, prompt: str, completion: str, images: list) -> Sequence:
    """A (prompt, completion) pair about `images` (PIL) for a vision-language model: the prompt as
    explorers lay it out (`engine.vlm.image_prompt_ids`: the images' placeholders, then the text),
    then the completion and EOS, which alone are learned; and the images' pixel values."""
    from streamrft.engine.vlm import image_prompt_ids, pixel_values

    tok = processor.tokenizer
    p = image_prompt_ids(processor, prompt, images)
    c = tok(completion, add_special_tokens=False).input_ids + [tok.eos_token_id]
    return p + c, [0] * len(p) + [1] * len(c), pixel_values(processor, images)


def _pixels(sequences: list[Sequence]) -> torch.Tensor | None:
    """The batch's pixel values, row after row (the order of the placeholders in the batch), or None."""
    pixels = [s[2] for s in sequences if len(s) > 2 and s[2] is not None]
    return torch.cat(pixels) if pixels else None


def _batch(tokenizer, sequences: list[Sequence]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded input ids, attention mask and labels (-100 where the mask is 0)."""
    seqs = [s[0] for s in sequences]
    labels = [[t if m else -100 for t, m in zip(s[0], s[1])] for s in sequences]
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
    return sft_on_sequences(model, tokenizer, [pair_sequence(tokenizer, p, c) for p, c in pairs], steps,
                            batch_size=batch_size, lr=lr, seed=seed, weight_decay=weight_decay)


def lr_factor(step: int, steps: int, warmup_steps: int = 0, schedule: str = "constant",
              min_lr_ratio: float = 0.1) -> float:
    """The learning rate's multiplier at optimizer step `step` (from 0) of `steps`.

    >>> [round(lr_factor(i, 10, 2, "cosine", 0.0), 3) for i in (0, 1, 2, 6, 10)]
    [0.5, 1.0, 1.0, 0.5, 0.0]
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    if schedule != "cosine":
        raise ValueError(f"schedule={schedule!r} is not one of ['constant', 'cosine']")
    done = min(1.0, (step - warmup_steps) / max(1, steps - warmup_steps))
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * done))


def sft_on_sequences(
    model: torch.nn.Module,
    tokenizer,
    sequences: list[Sequence],
    steps: int,
    batch_size: int = 16,
    lr: float = 1e-3,
    seed: int = 0,
    weight_decay: float = 0.0,
    on_step: Callable[[int, float], None] | None = None,
    desc: str = "sft",
    warmup_steps: int = 0,
    schedule: str = "constant",
    min_lr_ratio: float = 0.1,
    max_grad_norm: float | None = None,
) -> list[float]:
    """`sft_warmup` on token sequences with their masks (e.g. multi-turn demonstrations, whose
    environment turns are masked out); returns the loss of each step, and passes each (step from
    1, loss) to `on_step` (the stage's metric logger). A progress bar named `desc` on a terminal.
    The learning rate warms up linearly over `warmup_steps`, then stays (`constant`) or decays
    (`cosine`) to `min_lr_ratio` * `lr`; `max_grad_norm` clips the gradient."""
    from streamrft.monitor.bars import bar

    if not sequences:
        raise ValueError("no SFT sequences")
    rng = random.Random(seed)
    device = next(model.parameters()).device
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: lr_factor(i, steps, warmup_steps, schedule, min_lr_ratio))
    was_training = model.training
    model.train()
    losses = []
    with bar(steps, desc) as progress:
        for step in range(1, steps + 1):
            chosen = rng.choices(sequences, k=batch_size)
            ids, mask, lab = (t.to(device) for t in _batch(tokenizer, chosen))
            pixels = _pixels(chosen)
            extra = {} if pixels is None else {"pixel_values": pixels.to(device)}
            loss = model(input_ids=ids, attention_mask=mask, labels=lab, **extra).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            opt.step()
            sched.step()
            losses.append(loss.item())
            if on_step is not None:
                on_step(step, losses[-1])
            progress.update(1)
            progress.set_postfix(loss=f"{losses[-1]:.4f}", refresh=False)
    model.train(was_training)
    return losses
