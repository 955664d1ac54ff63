"""Repetition: drop a trajectory whose word n-grams repeat too much (degenerate loops).

ratio = 1 - distinct n-grams / n-grams; "a b c a b c a b c" has 7 trigrams, 3 distinct: 4/7.
A response with fewer than `n` words has ratio 0. Params: `n` (3), `max_ratio` (0.5).
"""
from __future__ import annotations


def repeat_ratio(text: str, n: int) -> float:
    words = text.split()
    grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


def make(n: int = 3, max_ratio: float = 0.5):
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n={n!r} must be an integer >= 1")
    if not 0.0 <= max_ratio <= 1.0:
        raise ValueError(f"max_ratio={max_ratio!r} must be in [0, 1]")

    def repetition_op(group) -> dict[int, str]:
        drops = {}
        for i, t in enumerate(group.trajectories):
            r = repeat_ratio(t.response_text, n)
            if r > max_ratio:
                drops[i] = f"{n}-gram repeat ratio {r:.3f} > {max_ratio}"
        return drops

    return repetition_op
