"""Math answer check with the `math-verify` package: 1.0 when the response's final answer equals
the ground truth mathematically (e.g. "\\boxed{4}" vs "4", "1/2" vs "0.5"), else 0.0.

The package is imported on first use, so the registry loads without it. `parse` extracts the
answer (LaTeX, boxed, plain numbers); `verify(gold, prediction)` compares symbolically.
"""
from __future__ import annotations


def math_verify_reward(response: str, answer: str | None, **params) -> float:
    if answer is None:
        return 0.0
    from math_verify import parse, verify

    gold = parse(answer)
    pred = parse(response)
    if not gold or not pred:
        return 0.0
    return 1.0 if verify(gold, pred) else 0.0
