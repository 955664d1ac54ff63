"""How the scorer calls a reward function: what context it asks for, whether it is inline, async or
blocking, whether it is built once per worker from its params (a factory), and `ResolvedReward`,
one configured term with its function looked up."""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

RewardFn = Callable[..., float]

CONTEXT = ("task", "trajectory")
"""What a reward may ask for by naming a keyword parameter (see the module docstring)."""


def reward_context(fn: RewardFn) -> tuple[str, ...]:
    """The names in `CONTEXT` that `fn` takes as keyword parameters; `**kwargs` alone asks for none."""
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin or C callable without a signature: the plain call
        return ()
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return tuple(name for name in CONTEXT if name in parameters and parameters[name].kind in keyword)


KINDS = ("inline", "async", "blocking")


def reward_kind(fn: RewardFn) -> str:
    """How the scorer calls `fn`: "async" (a coroutine function), "blocking" (`fn.blocking` is true), else "inline"."""
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None)):
        return "async"
    return "blocking" if getattr(fn, "blocking", False) else "inline"


def is_factory(fn: RewardFn) -> bool:
    """True for a reward that is built once per worker from its term's params (`fn.factory`)."""
    return bool(getattr(fn, "factory", False))


@dataclass(frozen=True)
class ResolvedReward:
    """One reward term, its function looked up. `fn=None` means the trajectory's `env_reward`.

    `context`: which of `task` / `trajectory` the function takes (`rewards.reward_context`), found once here;
    `kind`: inline, async or blocking (`rewards.reward_kind`). The last four fields apply to slow
    (async, blocking) terms only: see `RewardTerm`.
    """

    name: str
    fn: Callable[..., float] | None
    weight: float = 1.0
    params: dict[str, Any] = field(default_factory=dict)
    timeout_s: float = 30.0
    retries: int = 2
    backoff_s: float = 0.5
    fallback: float | None = None
    context: tuple[str, ...] = field(init=False, default=())
    kind: str = field(init=False, default="inline")

    def __post_init__(self):
        object.__setattr__(self, "context", () if self.fn is None else reward_context(self.fn))
        object.__setattr__(self, "kind", "inline" if self.fn is None else reward_kind(self.fn))

    @property
    def slow(self) -> bool:
        return self.kind != "inline"
