"""Reward functions, chosen by name from `REWARDS` (the config's `stream_ops.rewards[].name`).

Every reward is a pure `fn(response: str, answer: str | None, **params) -> float`, one per module.
Add one by writing such a module and listing it here, or point a config at your own function with
`import_path: "pkg.module:function"` (it wins over `name`).

A reward that needs the whole episode names keyword parameters `task` (the `schemas.Task`: prompt,
answer, metadata) and/or `trajectory` (the `schemas.Trajectory`: `response_text` is the whole
transcript under `multi_turn`, plus `env_reward` and `info`, e.g. `info["turns"]`); it gets them,
and the others do not (`reward_context`, looked up once when the term is resolved):

    def solved_fast(response, answer, *, task, trajectory, per_turn=0.1):
        if not trajectory.env_reward:
            return 0.0
        return 1.0 - per_turn * trajectory.info["turns"] / task.metadata.get("max_turns", 8)

How the scorer calls a reward (`reward_kind`; stream ops score many records at once, each a task):
- a plain function (`"inline"`, the rule rewards): called in the event loop; it must be fast
  (microseconds), as it holds up every other record while it runs.
- an `async def` coroutine function (`"async"`, e.g. the judge's HTTP back end): awaited.
- a plain function with the attribute `blocking = True` (`"blocking"`, e.g. a local model, a
  sandbox): run off the event loop in the worker's thread pool (`stream_ops.threads` threads).
Async and blocking terms are "slow": the scorer runs each trajectory's call with the term's
`timeout_s` per attempt and `retries` more attempts after a failure or timeout, waiting `backoff_s`,
then twice that, ... between them (`RewardTerm` in streamrft/config/stream_ops.py). After the last
attempt the group is dead-lettered with the reason (term, trajectory, attempts, last error), or,
when the term sets `fallback`, that trajectory scores the fallback value (counted in the worker's
`reward_fallbacks` metric). A timed-out blocking call keeps its thread until it returns (Python
cannot stop a thread): bound the work yourself (a sandbox's own wall timeout) where it can hang.
Inline terms raise straight to a dead letter, as before. A slow record never delays other records
or the commit of earlier ones; commits still follow input order.

A reward that must set something up once per worker (load a model, open a client) is a factory:
a callable with the attribute `factory = True`, called once per worker with the term's `params`;
it returns the reward function (any kind above), which is then called without them
(`judge.make_judge`, `reward_model.make_reward_model`).
"""
from __future__ import annotations

import functools
import importlib

from streamrft.stream_ops.rewards.code_tests import code_tests
from streamrft.stream_ops.rewards.exact_match import exact_match
from streamrft.stream_ops.rewards.format import format_reward
from streamrft.stream_ops.rewards.judge import make_judge
from streamrft.stream_ops.rewards.kinds import CONTEXT, KINDS, RewardFn, is_factory, reward_context, reward_kind
from streamrft.stream_ops.rewards.math_verify import math_verify_reward
from streamrft.stream_ops.rewards.reverse import reverse_reward
from streamrft.stream_ops.rewards.reward_model import make_reward_model
from streamrft.stream_ops.rewards.weighted_mix import weighted_mix


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


REWARDS: dict[str, RewardFn] = {
    "exact_match": exact_match,
    "math_verify": math_verify_reward,
    "format": format_reward,
    "reverse": reverse_reward,
    "weighted_mix": functools.partial(weighted_mix, resolve=resolve_reward),
    "judge": make_judge,
    "reward_model": make_reward_model,
    "code_tests": code_tests,
}


__all__ = ["CONTEXT", "KINDS", "REWARDS", "RewardFn", "check_tasks", "is_factory", "resolve_reward", "reward_context", "reward_kind"]


def check_tasks(terms, tasks) -> None:
    """Refuse, at load time, tasks a reward term cannot score: each term whose reward has a
    `check_task(task, **params)` sees every task; the first refusal raises ValueError naming the
    task and the term (e.g. a code_tests test that cannot be split into a call and a literal)."""
    for term in terms:
        if term.name in ("env", "feedback") and not term.import_path:
            continue
        check = getattr(resolve_reward(term.name, term.import_path), "check_task", None)
        if check is None:
            continue
        for task in tasks:
            try:
                check(task, **term.params)
            except ValueError as e:
                raise ValueError(f"task {task.task_id}: reward {term.import_path or term.name}: {e}") from None
