"""The CPU demo's reward (string reversal, `streamrft.producers.synthetic`): dense partial credit.

1.0 on an exact match (surrounding whitespace ignored); otherwise the fraction of positions where
response and answer agree, over the longer of the two, so a partial answer scores below 1.0 and
a too-long or too-short one pays for every missing or extra character.

>>> reverse_reward("dcba", "dcba"), reverse_reward("dcxa", "dcba"), reverse_reward("dcbaa", "dcba")
(1.0, 0.75, 0.8)
"""
from __future__ import annotations


def reverse_reward(response: str, answer: str | None, **params) -> float:
    if answer is None:
        return 0.0
    response, answer = response.strip(), answer.strip()
    if response == answer:
        return 1.0
    longest = max(len(response), len(answer))
    return sum(a == b for a, b in zip(response, answer)) / longest
