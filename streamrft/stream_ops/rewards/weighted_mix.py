"""A weighted sum of other rewards: `components=[{"name": ..., "weight": ..., "params": {...}}]`.

Each component is looked up in `REWARDS` by name and called with its own params; weights are used
as given (not normalised), so weights summing to 1 keep the mix in [0, 1].
"""
from __future__ import annotations


def weighted_mix(response: str, answer: str | None, components: list[dict] | None = None, **params) -> float:
    from streamrft.stream_ops.rewards import is_factory, resolve_reward, reward_kind  # late: the registry imports this

    if not components:
        raise ValueError("weighted_mix needs a non-empty `components` list")
    total = 0.0
    for comp in components:
        if comp.get("name") == "weighted_mix":
            raise ValueError("weighted_mix cannot nest itself")
        fn = resolve_reward(comp.get("name"), comp.get("import_path"))
        if is_factory(fn) or reward_kind(fn) != "inline":  # model rewards need the scorer's timeouts and threads
            raise ValueError(f"weighted_mix mixes plain rewards only; make {comp.get('name') or comp.get('import_path')!r} "
                             f"a reward term of its own (with its weight)")
        total += float(comp.get("weight", 1.0)) * fn(response, answer, **comp.get("params", {}))
    return total
