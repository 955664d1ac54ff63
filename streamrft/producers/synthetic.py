"""The CPU demo's task: reverse a short string of letters ("rev abcd=" -> "dcba").

A tiny char-level model learns it by GRPO in minutes on two cores; the reward is
`streamrft.stream_ops.rewards.reverse` (per-position partial credit, 1.0 on an exact match).
Train and eval strings are disjoint by a stable hash of the string, so the held-out eval set
never leaks into training whatever the seeds. Write files with `write_jsonl(make_demo_tasks(...))`;
`make_warmup_pairs` gives the SFT warm-up's (prompt, completion) pairs.
"""
from __future__ import annotations

import json
import random
import zlib
from pathlib import Path

LETTERS = "abcdefgh"
"""The letters the strings are drawn from."""
PROMPT_PREFIX = "rev "
PROMPT_SUFFIX = "="
ALPHABET = "".join(sorted(set(LETTERS + PROMPT_PREFIX + PROMPT_SUFFIX)))
"""Every character a demo prompt or answer can hold: the char tokenizer's vocabulary."""
MIN_LEN, MAX_LEN = 3, 6
EVAL_BUCKETS = 10
"""One string in EVAL_BUCKETS (by crc32) belongs to the eval split, the rest to train."""


def make_prompt(word: str) -> str:
    return f"{PROMPT_PREFIX}{word}{PROMPT_SUFFIX}"


def split_of(word: str) -> str:
    return "eval" if zlib.crc32(word.encode()) % EVAL_BUCKETS == 0 else "train"


def make_demo_tasks(
    n: int,
    seed: int = 0,
    split: str = "train",
    min_len: int = MIN_LEN,
    max_len: int = MAX_LEN,
    letters: str = LETTERS,
    trivial_frac: float = 0.0,
    impossible_frac: float = 0.0,
) -> list[dict]:
    """`n` tasks `{"task_id", "prompt", "answer"}` of `split` ("train" or "eval").

    Strings repeat only by chance (the train split is large); lengths are uniform in
    [min_len, max_len]. Deterministic in (n, seed, split, lengths, letters, fractions).

    A task-selection demo mixes difficulties into the train split (eval stays plain): a
    `trivial_frac` share of one-letter strings (the answer is the string itself), an
    `impossible_frac` share whose answer is a random string of the same letters, not the reversal
    (mislabelled: nothing in the prompt tells it). Each row of a mix names its `kind`
    (trivial / impossible / learnable), which becomes the task's `metadata.kind`.
    """
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', not {split!r}")
    if not 1 <= min_len <= max_len:
        raise ValueError(f"need 1 <= min_len <= max_len, got {min_len}, {max_len}")
    if not (0.0 <= trivial_frac and 0.0 <= impossible_frac and trivial_frac + impossible_frac <= 1.0):
        raise ValueError(f"need trivial_frac, impossible_frac >= 0 with a sum <= 1, got {trivial_frac}, {impossible_frac}")
    bad = set(letters) - set(LETTERS)
    if bad:
        raise ValueError(f"letters {sorted(bad)} are outside the tokenizer's alphabet {LETTERS!r}")
    rng = random.Random(f"{split}:{seed}")
    mixed = split == "train" and (trivial_frac > 0 or impossible_frac > 0)
    rows = []
    while len(rows) < n:
        word = "".join(rng.choice(letters) for _ in range(rng.randint(min_len, max_len)))
        if split_of(word) != split:
            continue
        row = {"task_id": f"rev-{split}-{seed}-{len(rows)}", "prompt": make_prompt(word), "answer": word[::-1]}
        if mixed:
            draw, kind = rng.random(), "learnable"
            if draw < trivial_frac:
                kind, letter = "trivial", rng.choice(letters)
                row.update(prompt=make_prompt(letter), answer=letter)
            elif draw < trivial_frac + impossible_frac:
                kind = "impossible"
                while row["answer"] == word[::-1]:
                    row["answer"] = "".join(rng.choice(letters) for _ in word)
            row["kind"] = kind
        rows.append(row)
    return rows


def make_warmup_pairs(
    n: int,
    seed: int = 0,
    complete_frac: float = 1.0,
    min_len: int = MIN_LEN,
    max_len: int = MAX_LEN,
) -> list[tuple[str, str]]:
    """SFT warm-up pairs (prompt, completion) from the train split: a `complete_frac` share with
    the full reversed answer, the rest terse (only its first letter).

    The demo warms up in two stages: complete_frac=1.0 teaches reversal, then a short stage at
    complete_frac=0.2 teaches the policy to stop after one letter most of the time. Greedy
    decoding then answers tersely (eval reward about 0.25) while sampling still completes about
    a fifth of the answers, so GRPO groups carry signal from the first step and RL has a
    behaviour to find and sharpen (see the demo's recipe in examples/).
    """
    if not 0.0 <= complete_frac <= 1.0:
        raise ValueError(f"complete_frac must be in [0, 1], got {complete_frac}")
    rng = random.Random(f"warmup:{seed}")
    rows = make_demo_tasks(n, seed=seed, split="train", min_len=min_len, max_len=max_len)
    return [(r["prompt"], r["answer"] if rng.random() < complete_frac else r["answer"][:1]) for r in rows]


def write_jsonl(rows: list[dict], path: str | Path) -> Path:
    """Write one JSON object per line (parent folders created); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path
