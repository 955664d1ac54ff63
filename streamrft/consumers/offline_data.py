"""Local datasets for offline training (SFT, DPO, KTO): JSONL or Parquet in, token ids out.

Four shapes, found from the columns (or forced with `shape=`): "dpo" prompt/chosen/rejected,
"kto" prompt/completion/label (label True = desirable), "sft" prompt/completion, and "chat",
a `messages` list whose last assistant message is the completion (an SFT example).
`load_offline_dataset(path, tokenizer)` returns tokenised `OfflineExample`s, every completion
ending with EOS so the policy learns to stop.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

SHAPE_COLUMNS = {
    "dpo": ("prompt", "chosen", "rejected"),
    "kto": ("prompt", "completion", "label"),
    "sft": ("prompt", "completion"),
    "chat": ("messages",),
}
"""Checked in this order, so a file with a `label` column is KTO, not SFT."""

SHAPES_FOR = {"sft": ("sft", "chat"), "dpo": ("dpo",), "kto": ("kto",)}
"""Which data shapes each offline algorithm trains on."""

_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


@dataclass
class OfflineExample:
    prompt_ids: list[int]
    completion_ids: list[int]
    """The completion (chosen one for DPO), EOS last."""
    rejected_ids: list[int] | None = None
    """DPO only."""
    label: bool | None = None
    """KTO only: True = desirable."""


@dataclass
class OfflineDataset:
    path: str
    shape: str
    examples: list[OfflineExample]

    def __len__(self) -> int:
        return len(self.examples)


@dataclass
class SeqBatch:
    """Right-padded prompt + completion rows, laid out as `consumers.batch.Batch` (so
    `token_logprobs` reads it): `mask` `[B, L-1]` is 1 where column t predicts a completion token."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    mask: torch.Tensor

    def to(self, device) -> "SeqBatch":
        return SeqBatch(self.input_ids.to(device), self.attention_mask.to(device), self.mask.to(device))


def detect_shape(columns: list[str], path: str, shape: str | None = None) -> str:
    """The shape `columns` hold (or check that they hold the forced `shape`)."""
    if shape is not None and shape not in SHAPE_COLUMNS:
        raise ValueError(f"shape={shape!r} is not one of {list(SHAPE_COLUMNS)}")
    candidates = [shape] if shape else list(SHAPE_COLUMNS)
    for name in candidates:
        if all(c in columns for c in SHAPE_COLUMNS[name]):
            return name
    wanted = "; ".join(f"{k}: {'/'.join(v)}" for k, v in SHAPE_COLUMNS.items() if k in candidates)
    raise ValueError(f"{path}: columns {sorted(columns)} match no offline data shape (expected {wanted})")


def read_rows(path: str | Path) -> tuple[list[str], list[dict]]:
    """(column names, rows) of a JSONL/JSON or Parquet file, read with HF `datasets`."""
    from datasets import load_dataset

    path = Path(path)
    fmt = _FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise ValueError(f"{path}: unsupported file type {path.suffix!r} (use one of {sorted(_FORMATS)})")
    if not path.exists():
        raise FileNotFoundError(f"offline data file {path} does not exist")
    ds = load_dataset(fmt, data_files=str(path), split="train")
    return list(ds.column_names), ds.to_list()


def render_messages(messages: list[dict], tokenizer) -> tuple[str, str]:
    """(prompt, completion) of a chat: the completion is the last assistant message's content,
    the prompt everything before it, rendered with the tokenizer's chat template (generation
    prompt added) or, without one, as "role: content" lines followed by "assistant: "."""
    last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=None)
    if last is None:
        raise ValueError("a chat example needs an assistant message (the completion)")
    history = messages[:last]
    if getattr(tokenizer, "chat_template", None):
        prompt = tokenizer.apply_chat_template(history, tokenize=False, add_generation_prompt=True)
    else:
        prompt = "".join(f"{m['role']}: {m['content']}\n" for m in history) + "assistant: "
    return prompt, messages[last]["content"]


def _label(value, where: str) -> bool:
    # a 0/1 integer column is common; anything else is more likely a mistake than a label
    if isinstance(value, bool) or value in (0, 1):
        return bool(value)
    raise ValueError(f"{where}: label must be a bool (or 0/1), got {value!r}")


def tokenize_row(row: dict, shape: str, tokenizer, where: str) -> OfflineExample:
    """One row of `shape` as token ids. A chat-templated prompt already holds its special
    tokens; a plain prompt gets the tokenizer's own (e.g. BOS), as at rollout time."""
    if shape == "chat":
        prompt, completion = render_messages(row["messages"], tokenizer)
        templated = bool(getattr(tokenizer, "chat_template", None))
    else:
        prompt, completion = row["prompt"], row.get("chosen" if shape == "dpo" else "completion")
        templated = False
    texts = [prompt, completion] + ([row["rejected"]] if shape == "dpo" else [])
    if not all(isinstance(t, str) for t in texts):
        raise ValueError(f"{where}: prompt and completions must be strings")
    prompt_ids = tokenizer(prompt, add_special_tokens=not templated).input_ids

    def completion_ids(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]

    return OfflineExample(
        prompt_ids=prompt_ids,
        completion_ids=completion_ids(completion),
        rejected_ids=completion_ids(row["rejected"]) if shape == "dpo" else None,
        label=_label(row["label"], where) if shape == "kto" else None,
    )


def load_offline_dataset(path: str | Path, tokenizer, shape: str | None = None) -> OfflineDataset:
    """Read and tokenise a dataset file; `shape` forces one of `SHAPE_COLUMNS` instead of detecting it."""
    columns, rows = read_rows(path)
    found = detect_shape(columns, str(path), shape)
    if not rows:
        raise ValueError(f"{path}: no rows")
    examples = [tokenize_row(r, found, tokenizer, f"{path} row {i}") for i, r in enumerate(rows)]
    return OfflineDataset(str(path), found, examples)


def collate_sequences(pairs: list[tuple[list[int], list[int]]], pad_id: int) -> SeqBatch:
    """(prompt ids, completion ids) pairs -> one right-padded `SeqBatch`."""
    width = max(len(p) + len(c) for p, c in pairs)
    ids = torch.full((len(pairs), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(pairs), width), dtype=torch.long)
    mask = torch.zeros((len(pairs), width - 1))
    for b, (p, c) in enumerate(pairs):
        ids[b, : len(p) + len(c)] = torch.tensor(p + c)
        attn[b, : len(p) + len(c)] = 1
        # column t scores token t+1: the completion's tokens are predicted from p-1 on
        mask[b, len(p) - 1 : len(p) - 1 + len(c)] = 1.0
    return SeqBatch(ids, attn, mask)
