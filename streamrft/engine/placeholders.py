"""A vision-language model's image placeholder tokens: never sampled, never scored.

`ban_placeholders(model)` (called by `engine.models.load_policy` for every vision-language model)
sets the model's logits of the token ids its config reserves for images to `BANNED_LOGIT` in
every forward, so the explorers' engines sample from, and the trainer recomputes log-probs under,
the same distribution over the other tokens. A sampled placeholder would have no image behind it.
"""
from __future__ import annotations

import torch

BANNED_LOGIT = -1e4  # exp() of it is 0 in every dtype, and it stays finite after any temperature
PLACEHOLDER_KEYS = ("image_token_index", "image_token_id", "video_token_id", "vision_start_token_id",
                    "vision_end_token_id", "vision_token_id")


def placeholder_ids(config) -> list[int]:
    """The token ids a vision-language model's config reserves for images (placeholders, and the
    markers around them): the model must never sample them."""
    ids = {getattr(config, k) for k in PLACEHOLDER_KEYS if isinstance(getattr(config, k, None), int)}
    return sorted(ids)


def ban_placeholders(model) -> list[int]:
    """Make the model's logits of its image placeholder tokens `BANNED_LOGIT`, in every forward (a
    hook): a sampled placeholder would have no image behind it. The engine samples from, and the
    trainer recomputes log-probs under, the same distribution over the other tokens. Returns the ids."""
    ids = placeholder_ids(model.config)
    if not ids:
        return ids
    index = torch.tensor(ids)

    def hook(_module, _args, output):
        logits = getattr(output, "logits", None)
        if logits is not None:
            logits.index_fill_(-1, index.to(logits.device), BANNED_LOGIT)
        return output

    model.register_forward_hook(hook)
    return ids
