"""Slow reward terms (async or blocking rewards): timeouts, retries with backoff, fallback or dead letter.

`slow_components(group, terms, pool)` runs every slow term on every trajectory of a group at once
and returns `{term: [value per trajectory]}`; `call_with_policy` is one trajectory's call under its
term's policy (`RewardTerm.timeout_s`, `retries`, `backoff_s`, `fallback`). The contract a reward
function follows is in `streamrft.stream_ops.rewards`.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import math
from concurrent.futures import Executor

from streamrft.schemas import RolloutGroup
from streamrft.stream_ops.errors import ScoringError
from streamrft.stream_ops.rewards.kinds import ResolvedReward

log = logging.getLogger(__name__)


def backoff_delays(retries: int, backoff_s: float) -> list[float]:
    """Seconds to wait before each retry: backoff_s, 2 backoff_s, 4 backoff_s, ...

    >>> backoff_delays(3, 0.5)
    [0.5, 1.0, 2.0]
    """
    return [backoff_s * 2 ** k for k in range(retries)]


def _attempt(term: ResolvedReward, group: RolloutGroup, i: int, pool: Executor | None):
    """One call of the term on trajectory i: an awaitable, never run on the event loop's thread if blocking."""
    traj = group.trajectories[i]
    given = {"task": group.task, "trajectory": traj}
    call = functools.partial(term.fn, traj.response_text, group.task.answer, **term.params,
                             **{name: given[name] for name in term.context})
    if term.kind == "async":
        return call()
    return asyncio.get_running_loop().run_in_executor(pool, call)


async def call_with_policy(term: ResolvedReward, group: RolloutGroup, i: int, pool: Executor | None = None,
                           stats: dict | None = None) -> float:
    """Trajectory i's value of a slow term: each attempt bounded by `timeout_s`, `retries` more after
    a failure (an exception, a timeout, a non-finite value), then `fallback` or `ScoringError`."""
    traj_id = group.trajectories[i].traj_id
    delays = backoff_delays(term.retries, term.backoff_s)
    error, error_type = "", ""
    for attempt in range(term.retries + 1):
        if attempt:
            await asyncio.sleep(delays[attempt - 1])
        try:
            value = float(await asyncio.wait_for(_attempt(term, group, i, pool), term.timeout_s))
            if math.isfinite(value):
                return value
            error, error_type = f"returned {value}", "ScoringError"
        except TimeoutError:  # asyncio.TimeoutError is TimeoutError since Python 3.11
            error, error_type = f"timed out after {term.timeout_s:g} s", "RewardTimeout"
        except Exception as e:  # a judge's HTTP error, a malformed answer, a user's bug: this attempt failed
            error, error_type = _describe(e), type(e).__name__
    attempts = term.retries + 1
    if term.fallback is not None:
        log.warning("reward term %r on trajectory %s: %d attempts failed (%s); scored %g (fallback)",
                    term.name, traj_id, attempts, error, term.fallback)
        if stats is not None:
            stats["fallbacks"] = stats.get("fallbacks", 0) + 1
        return float(term.fallback)
    raise ScoringError(f"reward term {term.name!r} failed on trajectory {traj_id} after {attempts} attempt"
                       f"{'s' if attempts > 1 else ''}: {error}", error_type)


def _describe(e: Exception) -> str:
    try:
        return f"{type(e).__name__}: {e}"
    except Exception:  # a user's exception class whose __str__ raises
        return f"{type(e).__name__} (unprintable)"


async def slow_components(group: RolloutGroup, terms: list[ResolvedReward], pool: Executor | None = None,
                          stats: dict | None = None) -> dict[str, list[float]]:
    """Every slow term's value on every trajectory, all called concurrently; the first failure
    (after its retries, without a fallback) cancels the rest and raises."""
    n = len(group.trajectories)
    tasks = {(term.name, i): asyncio.ensure_future(call_with_policy(term, group, i, pool, stats))
             for term in terms for i in range(n)}
    try:
        await asyncio.gather(*tasks.values())
    except BaseException:
        for task in tasks.values():
            task.cancel()
        raise
    return {term.name: [tasks[(term.name, i)].result() for i in range(n)] for term in terms}
