"""A seeded delay on every step of any environment: a realistic slow tool made of a fast game.

`explorer.env.latency: {dist: lognormal, median_s, p99_s, seed}` wraps each new environment so that
`step` first waits a draw from a lognormal distribution with that median and 99th percentile
(sigma = ln(p99 / median) / 2.326), then answers as the environment would. The game, its rewards
and its observations are unchanged. Environment k made in a process draws from
`Random(f"{seed}:{k}")`, so a run's delays repeat.

`SlowEnv` sleeps (the lockstep loop waits for it, as it would for a slow synchronous tool);
`AsyncSlowEnv` awaits the delay, so episodes scheduled one by one wait for their tools together
(`workflows/scheduler.py`), as they would for an HTTP call.
"""
from __future__ import annotations

import asyncio
import inspect
import itertools
import math
import random
import time
from typing import Any, Callable

Z99 = 2.3263478740408408  # the standard normal's 99th percentile


class Latency:
    """Delays drawn from a lognormal distribution with the given median and 99th percentile."""

    def __init__(self, median_s: float, p99_s: float, rng: random.Random):
        if not 0 < median_s <= p99_s:
            raise ValueError(f"need 0 < median_s <= p99_s, got median_s={median_s}, p99_s={p99_s}")
        self.mu, self.sigma, self.rng = math.log(median_s), math.log(p99_s / median_s) / Z99, rng

    def draw(self) -> float:
        return self.rng.lognormvariate(self.mu, self.sigma)


class SlowEnv:
    """`inner`, each step delayed by `latency.draw()` seconds of sleep."""

    def __init__(self, inner: Any, latency: Latency):
        self.inner, self.latency = inner, latency
        self.waited_s = 0.0

    def reset(self, task):
        return self.inner.reset(task)

    def step(self, action: str):
        delay = self.latency.draw()
        time.sleep(delay)
        self.waited_s += delay
        return self.inner.step(action)

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()


class AsyncSlowEnv(SlowEnv):
    """The same, awaiting the delay; a synchronous `inner` answers right after it."""

    async def reset(self, task):
        out = self.inner.reset(task)
        return await out if inspect.isawaitable(out) else out

    async def step(self, action: str):
        delay = self.latency.draw()
        await asyncio.sleep(delay)
        self.waited_s += delay
        out = self.inner.step(action)
        return await out if inspect.isawaitable(out) else out


def with_latency(factory: Callable[[], Any], median_s: float, p99_s: float, seed: int = 0,
                 asynchronous: bool = False) -> Callable[[], SlowEnv]:
    """A factory of `factory()`'s environments, each with its own seeded delays."""
    count = itertools.count()
    cls = AsyncSlowEnv if asynchronous else SlowEnv

    def make() -> SlowEnv:
        return cls(factory(), Latency(median_s, p99_s, random.Random(f"{seed}:{next(count)}")))

    return make
