"""Word-problem-free arithmetic for a real instruct model: "What is 47 + 38? Answer with just the number."

The first GRPO task of many recipes (correctness + format rewards): a small pretrained model
(SmolLM2-135M-Instruct) adds two-digit numbers right about a fifth of the time and, asked for
"just the number", answers in a sentence instead ("47 + 38 = 85", "The answer is 85."). Train and
eval pairs are disjoint by a stable hash of the pair, so the held-out set never leaks whatever the
seeds. `data.synthetic: {task: addition, ...}` writes them (`launch/prepare.py`).
"""
from __future__ import annotations

import random
import zlib

PROMPT = "What is {a} {op} {b}? Answer with just the number."
EVAL_BUCKETS = 10
"""One pair in EVAL_BUCKETS (by crc32) belongs to the eval split, the rest to train."""
_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def split_of(a: int, op: str, b: int) -> str:
    return "eval" if zlib.crc32(f"{a}{op}{b}".encode()) % EVAL_BUCKETS == 0 else "train"


def make_tasks(n: int, seed: int = 0, split: str = "train", min_operand: int = 10, max_operand: int = 99,
               ops: str = "+") -> list[dict]:
    """`n` tasks `{"task_id", "prompt", "answer"}` of `split`; deterministic in the arguments."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', not {split!r}")
    if not 0 <= min_operand <= max_operand:
        raise ValueError(f"need 0 <= min_operand <= max_operand, got {min_operand}, {max_operand}")
    if not ops or set(ops) - set(_OPS):
        raise ValueError(f"ops must be a non-empty subset of {''.join(_OPS)!r}, got {ops!r}")
    rng = random.Random(f"addition:{split}:{seed}")
    rows, tries = [], 0
    while len(rows) < n:
        tries += 1
        if tries > 1000 * (n + 1) and not rows:
            raise ValueError(f"no {split} pair among operands {min_operand}-{max_operand} and ops {ops!r}")
        a, op, b = rng.randint(min_operand, max_operand), rng.choice(ops), rng.randint(min_operand, max_operand)
        if split_of(a, op, b) != split:
            continue
        rows.append({"task_id": f"add-{split}-{seed}-{len(rows)}", "prompt": PROMPT.format(a=a, op=op, b=b),
                     "answer": str(_OPS[op](a, b))})
    return rows
