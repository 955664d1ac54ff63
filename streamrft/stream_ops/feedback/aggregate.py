"""A trajectory's reward from the ratings it received.

- `mean`: the mean of its scalar rewards, labels counted as their configured values.
- `majority`: the value of its most frequent label (a tie: the label listed first in the config);
  scalar rewards count as no label.
- `bradley_terry`: strengths fitted to the preferences among the group's items (Hunter's MM
  updates for the Bradley-Terry model), each compared pair given one virtual tie (half a win each
  way) so that an item that always won has a finite strength; a trajectory's reward is its
  log-strength less the group's mean log-strength.
"""
from __future__ import annotations

import math
from collections import Counter


def mean_reward(rewards: list[float], labels: list[str], values: dict[str, float]) -> float:
    """Mean over a trajectory's scalar rewards and its labels' values."""
    got = [*rewards, *(values[label] for label in labels)]
    if not got:
        raise ValueError("no rating to average")
    return sum(got) / len(got)


def majority_reward(labels: list[str], values: dict[str, float]) -> float:
    """The value of the most frequent label; ties go to the label listed first in `values`."""
    if not labels:
        raise ValueError("no label to take the majority of")
    counts = Counter(labels)
    top = max(counts.values())
    return values[next(label for label in values if counts.get(label) == top)]


def bradley_terry(items: list[str], preferences: list[tuple[str, str]], iterations: int = 200,
                  tol: float = 1e-10) -> dict[str, float]:
    """Each item's centred log-strength from (winner, loser) pairs among `items` (pairs naming
    another item are ignored). Items never compared get 0."""
    index = {item: k for k, item in enumerate(items)}
    wins = Counter()
    for winner, loser in preferences:
        if winner in index and loser in index and winner != loser:
            wins[(winner, loser)] += 1.0
    pairs = {tuple(sorted(p)) for p in wins}
    for a, b in pairs:  # one virtual tie a compared pair: half a win each way
        wins[(a, b)] += 0.5
        wins[(b, a)] += 0.5
    compared = sorted({i for p in pairs for i in p})
    strength = {i: 1.0 for i in compared}
    for _ in range(iterations):
        new = {}
        for i in compared:
            w = sum(n for (a, _), n in wins.items() if a == i)
            denominator = sum((wins[(i, j)] + wins[(j, i)]) / (strength[i] + strength[j])
                              for j in compared if j != i and (wins[(i, j)] or wins[(j, i)]))
            new[i] = w / denominator
        scale = math.exp(sum(math.log(s) for s in new.values()) / len(new))  # geometric mean 1
        new = {i: s / scale for i, s in new.items()}
        done = max(abs(new[i] - strength[i]) for i in compared) < tol
        strength = new
        if done:
            break
    logs = {i: math.log(strength[i]) if i in strength else 0.0 for i in items}
    centre = sum(logs.values()) / len(logs)
    return {i: v - centre for i, v in logs.items()}
