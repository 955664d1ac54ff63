"""Turn trajectories into padded training tensors and compute token log-probs under the policy.

Row b holds prompt + response, right-padded. Every tensor is `[B, L-1]`, aligned to the
predicted token: column t scores token t+1. `mask` is 1 on response tokens whose loss_mask is 1.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


TENSORS = ("input_ids", "attention_mask", "mask", "old_logprobs", "advantages", "rewards", "weights")


@dataclass
class Batch:
    input_ids: torch.Tensor      # [B, L]
    attention_mask: torch.Tensor  # [B, L]
    mask: torch.Tensor           # [B, L-1] float
    old_logprobs: torch.Tensor   # [B, L-1]
    advantages: torch.Tensor     # [B]
    rewards: torch.Tensor        # [B]
    weights: torch.Tensor        # [B] per-sample weight of the row's gradient (replay's importance weights; 1 fresh)
    pixel_values: torch.Tensor | None = None  # [images, C, H, W]: a vision-language batch's images, row by row
    image_rows: torch.Tensor | None = None  # [images]: the row each image belongs to (ascending)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def _images(self, rows: list[int]) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The images of `rows`, in their order, with their rows renumbered 0.. as in `rows`."""
        if self.pixel_values is None:
            return None, None
        keep, renumbered = [], []
        for new, row in enumerate(rows):
            idx = (self.image_rows == row).nonzero().flatten().tolist()
            keep += idx
            renumbered += [new] * len(idx)
        if not keep:
            return None, None
        return self.pixel_values[keep], torch.tensor(renumbered, dtype=torch.long)

    def slice(self, start: int, stop: int) -> "Batch":
        return Batch(*(getattr(self, f)[start:stop] for f in TENSORS),
                     *self._images(list(range(start, min(stop, len(self))))))

    def select(self, rows: list[int]) -> "Batch":
        """These rows, cut to the longest of them (trailing columns that are padding in every one dropped)."""
        idx = torch.tensor(rows, dtype=torch.long)
        width = int(self.attention_mask[idx].sum(1).max())
        return Batch(self.input_ids[idx, :width], self.attention_mask[idx, :width], self.mask[idx, :width - 1],
                     self.old_logprobs[idx, :width - 1], self.advantages[idx], self.rewards[idx], self.weights[idx],
                     *self._images(rows))

    def to(self, device) -> "Batch":
        return Batch(*(getattr(self, f).to(device) for f in TENSORS),
                     None if self.pixel_values is None else self.pixel_values.to(device), self.image_rows)


def micro_batches(lengths: list[int], max_seqs: int, max_tokens: int | None = None) -> list[list[int]]:
    """Split rows of these lengths into micro-batches of at most `max_seqs` rows and, when
    `max_tokens` is given, at most that many padded tokens (rows x the longest row; a row longer
    than it goes alone). With a token budget, rows are taken longest first so that each
    micro-batch holds similar lengths and little padding; without one, in order."""
    if max_tokens is None:
        return [list(range(i, min(i + max_seqs, len(lengths)))) for i in range(0, len(lengths), max_seqs)]
    out: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        # rows arrive longest first: the first row of a micro-batch is its widest
        if out and len(out[-1]) < max_seqs and lengths[out[-1][0]] * (len(out[-1]) + 1) <= max_tokens:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def collate(samples: list[tuple], pad_id: int, weights: list[float] | None = None, pixels=None) -> Batch:
    """samples: (Trajectory, advantage, reward) tuples; `weights`: one per sample (default 1).
    `pixels(trajectory)`: a vision-language model's pixel values ([k, C, H, W]) of the trajectory's
    `images`, the same the explorer's engine sampled with (trajectories without images: None)."""
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
    w = torch.ones(B) if weights is None else torch.tensor(weights, dtype=torch.float)
    images, rows = [], []
    for b, (t, _, _) in enumerate(samples):
        if t.images:
            if pixels is None:
                raise ValueError(f"trajectory {t.traj_id} shows {len(t.images)} image(s) to a text model")
            p = pixels(t)
            images.append(p)
            rows += [b] * p.shape[0]
    if not images:
        return Batch(ids, attn, mask, old, adv, rew, w)
    return Batch(ids, attn, mask, old, adv, rew, w, torch.cat(images), torch.tensor(rows, dtype=torch.long))


def _first_scored_column(mask: torch.Tensor) -> int:
    """The first column any row scores (0 when nothing is scored)."""
    cols = mask.any(dim=0).nonzero()
    return int(cols[0]) if len(cols) else 0


def token_logprobs(model, batch: Batch, temperature: float = 1.0, with_entropy: bool = False):
    """Log-prob of each next token under `model` at the explorers' sampling temperature, `[B, L-1]`.

    Only the columns from the first one any row's `mask` scores are computed (a model that takes
    `logits_to_keep`, as transformers' causal LMs do): the prompt before it gets no logits and no
    vocabulary-wide log-softmax, which for a real model (49k tokens) is most of the cost. Columns
    before it are 0.0 (nothing reads them: the mask is 0 there in every row).
    """
    width = batch.input_ids.shape[1] - 1
    first = _first_scored_column(batch.mask)
    pixels = getattr(batch, "pixel_values", None)  # a vision-language batch's images
    images = {} if pixels is None else {"pixel_values": pixels}
    try:
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, logits_to_keep=width + 1 - first,
                    **images)
    except TypeError as e:
        if "logits_to_keep" not in str(e):
            raise
        first = 0  # a model without it: every position
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, **images)
    logits = out.logits[:, -(width + 1 - first):-1].float()  # the columns first .. L-2
    if temperature not in (0.0, 1.0):
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, batch.input_ids[:, first + 1:].unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1) if with_entropy else None
    if first:
        pad = logp.new_zeros((logp.shape[0], first))
        logp = torch.cat([pad, logp], dim=1)
        entropy = None if entropy is None else torch.cat([pad, entropy], dim=1)
    return logp, entropy
