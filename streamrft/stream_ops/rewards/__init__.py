"""Reward functions, chosen by name from `REWARDS` (the config's `stream_ops.rewards[].name`).

Every reward is a pure `fn(response: str, answer: str | None, **params) -> float`, one per module.
Add one by writing such a module and listing it here, or point a config at your own function with
`import_path: "pkg.module:function"` (it wins over `name`).
"""
from __future__ import annotations

import importlib
from typing import Callable

from streamrft.stream_ops.rewards.exact_match import exact_match
from streamrft.stream_ops.rewards.format import format_reward
from streamrft.stream_ops.rewards.math_verify import math_verify_reward
from streamrft.stream_ops.rewards.reverse import reverse_reward
from streamrft.stream_ops.rewards.weighted_mix import weighted_mix

RewardFn = Callable[..., float]

REWARDS: dict[str, RewardFn] = {
    "exact_match": exact_match,
    "math_verify": math_verify_reward,
    "format": format_reward,
    "reverse": reverse_reward,
    "weighted_mix": weighted_mix,
}


def resolve_reward(name: str | None, import_path: str | None = None) -> RewardFn:
    """The reward at `import_path` ("pkg.module:function") if given, else `REWARDS[name]`."""
    if import_path:
        module, sep, attr = import_path.partition(":")
        if not sep or not module or not attr:
            raise ValueError(f"reward import_path {import_path!r} must look like 'pkg.module:function'")
        fn = getattr(importlib.import_module(module), attr)
        if not callable(fn):
            raise ValueError(f"reward import_path {import_path!r} is not callable")
        return fn
    if name not in REWARDS:
        raise ValueError(f"unknown reward {name!r}; allowed: {', '.join(sorted(REWARDS))}")
    return REWARDS[name]


__all__ = ["REWARDS", "RewardFn", "resolve_reward"]
