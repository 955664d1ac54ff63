"""Exact match: 1.0 when the stripped response equals the stripped answer, else 0.0.

>>> exact_match(" 42\\n", "42")
1.0
"""
from __future__ import annotations


def exact_match(response: str, answer: str | None, **params) -> float:
    if answer is None:
        return 0.0
    return 1.0 if response.strip() == answer.strip() else 0.0
