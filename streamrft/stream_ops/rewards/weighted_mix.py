"""A weighted sum of other rewards: `components=[{"name": ..., "weight": ..., "params": {...}}]`.

Each component is looked up in `REWARDS` by name and called with its own params; weights are used
as given (not normalised), so weights summing to 1 keep the mix in [0, 1].

The registry (`stream_ops.rewards.REWARDS`) holds it bound to its own lookup,
`partial(weighted_mix, resolve=resolve_reward)`: this module does not import the registry back.
"""
from __future__ import annotations

from typing import Callable

from streamrft.stream_ops.rewards.kinds import is_factory, reward_kind


def weighted_mix(response: str, answer: str | None, components: list[dict] | None = None, *,
                 resolve: Callable[[str | None, str | None], Callable[..., float]], **params) -> float:
    if not components:
        raise ValueError("weighted_mix needs a non-empty `components` list")
    total = 0.0
    for comp in components:
        if comp.get("name") == "weighted_mix":
            raise ValueError("weighted_mix cannot nest itself")
        fn = resolve(comp.get("name"), comp.get("import_path"))
        if is_factory(fn) or reward_kind(fn) != "inline":  # model rewards need the scorer's timeouts and threads
            raise ValueError(f"weighted_mix mixes plain rewards only; make {comp.get('name') or comp.get('import_path')!r} "
                             f"a reward term of its own (with its weight)")
        total += float(comp.get("weight", 1.0)) * fn(response, answer, **comp.get("params", {}))
    return total
