"""Episodes scheduled one by one (`explorer.scheduling: per_episode`): none waits for another.

`EpisodeScheduler.play(task, n)` starts `n` episodes of one task on the running event loop and
returns them once each has ended, however long its neighbours take; `sample(task, n)` asks for `n`
single-turn completions of its prompt (the single-turn workflow scheduled the same way: its groups
share engine calls with whatever else is ready, and each goes out as soon as its own call ends). Each episode is a coroutine:
reset its environment, then, turn after turn, wait for a model turn and step the environment with
it, until an ending (`episodes.py`: the same endings, masks and log-probs as the lockstep loop).

One coroutine feeds the engine: whenever episodes wait for a model turn it takes every one of them
(every request of the same `n`) into one `engine.generate` call (continuous batching at turn granularity), run in a thread of its
own, so environments keep stepping while the engine works. An episode waiting on its tool never
holds back a generate call. Before each call `before_generate` may load new weights (weights swap
between turns); each turn records the version that sampled it.

A synchronous environment's `reset`, `step` and `close` run in a pool of `env_threads` threads, an
`async def` one's on the loop; each call has `step_timeout_s`. A call that raises, answers garbage
or times out ends its episode with `env_error` or `env_timeout` (a timed-out synchronous call
keeps its thread until it returns: Python cannot stop a thread). `close()` is called on every
environment, whatever happened.

Where the engine's time goes is counted in `stats`: `generate_s` (in `engine.generate`), `load_s`
(`before_generate`), `env_s` (nothing to generate while environment calls were in flight) and
`reserve_s` (nothing to generate, no environment call in flight, and the owner's `opening()` says
groups are being admitted: the admission round trip is what the engine waits for) and `idle_s`
(nothing at all: the run's headroom holds new groups back).
"""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from streamrft.engine.rollout.base import Completion, RolloutEngine, SamplingParams
from streamrft.producers.envs.base import Environment
from streamrft.producers.workflows.episodes import (ENV_ERROR, ENV_TIMEOUT, MAX_TOTAL_TOKENS, EnvFailure, Episode,
                                                    TurnLimits, answer, check_observation, check_result,
                                                    failed_episode, model_turn, shown, turn_seed)
from streamrft.producers.workflows.prompts import prompt_of
from streamrft.producers.workflows.turns import TurnEncoder
from streamrft.schemas import Task

log = logging.getLogger(__name__)


@dataclasses.dataclass
class _Request:
    """Prompt ids waiting for `n` completions of up to `budget` tokens; `future` gets (completions, version)."""

    ids: list[int]
    n: int
    budget: int
    future: asyncio.Future
    seed: int | None = None
    images: list | None = None  # a vision-language prompt's images (PIL), in the order of its placeholders


class EpisodeScheduler:
    def __init__(self, engine: RolloutEngine, params: SamplingParams, *, env: Callable[[], Environment] | None,
                 limits: TurnLimits, chat: bool = False, env_threads: int = 16, step_timeout_s: float = 60.0,
                 before_generate: Callable[[], float | None] | None = None, batch_wait_s: float = 0.005,
                 max_rows: int | None = None, opening: Callable[[], int] | None = None):
        """`params.n` is ignored (`play` and `sample` say how many); `env` may be None for `sample` alone; `before_generate()` runs in the engine's thread
        before each call and returns the seconds it spent loading weights, or None. `batch_wait_s`: how
        long a ready episode waits for environment calls about to finish, to share the call. `max_rows`:
        sequences one engine call samples at most (the engine's `max_batch`: it would run a bigger call
        as batches one after the other anyway); what is left waits for the next call, which takes
        whatever became ready meanwhile. None: no bound. `opening()`: how many groups the owner is
        admitting (the engine's wait while some are counts as `reserve_s`, not `idle_s`)."""
        self.engine, self.params, self.env, self.limits = engine, params, env, limits
        self.encoder = TurnEncoder(engine.tokenizer, chat, getattr(engine, "vision", None))
        self.step_timeout_s, self.before_generate, self.batch_wait_s = step_timeout_s, before_generate, batch_wait_s
        self.max_rows, self.opening = max_rows, opening or (lambda: 0)
        self._env_pool = ThreadPoolExecutor(env_threads, thread_name_prefix="env")
        self._engine_pool = ThreadPoolExecutor(1, thread_name_prefix="engine")
        self.chat = chat
        self._ready: list[_Request] = []
        self._calling: list[_Request] = []  # the engine call's, while it runs
        self._wake: asyncio.Event | None = None
        self._feeder: asyncio.Task | None = None
        self._calls = 0
        self.failed: BaseException | None = None
        self.episodes_in_flight = 0
        self.env_in_flight = 0
        self.stats = {"generate_s": 0.0, "load_s": 0.0, "env_s": 0.0, "reserve_s": 0.0, "idle_s": 0.0, "generate_calls": 0,
                      "turns": 0, "episodes": 0}

    # ---- life cycle ------------------------------------------------------------------------------
    def start(self) -> None:
        """Start feeding the engine (call on the event loop that will run `play`)."""
        self._wake = asyncio.Event()
        self._feeder = asyncio.get_running_loop().create_task(self._feed(), name="engine-feeder")

    async def close(self) -> None:
        if self._feeder is not None:
            self._feeder.cancel()
            await asyncio.gather(self._feeder, return_exceptions=True)
        self._engine_pool.shutdown(wait=True)  # the engine's call in flight, if any, ends first
        self._env_pool.shutdown(wait=False, cancel_futures=True)  # a hung environment call never blocks this

    async def on_engine(self, fn: Callable, *args) -> Any:
        """`fn(*args)` in the engine's thread, between two generate calls (an eval, a weight load)."""
        return await asyncio.get_running_loop().run_in_executor(self._engine_pool, functools.partial(fn, *args))

    # ---- episodes --------------------------------------------------------------------------------
    async def play(self, task: Task, n: int, seed: int | None = None) -> list[Episode]:
        """`n` episodes of `task`, each played until its own ending; with `seed` (the group's) each
        model turn is sampled with its own `turn_seed`, as in lockstep."""
        self.episodes_in_flight += n
        try:
            return list(await asyncio.gather(*(self._episode(task, None if seed is None else (seed, j))
                                               for j in range(n))))
        finally:
            self.episodes_in_flight -= n

    async def sample(self, task: Task, n: int, seed: int | None = None) -> tuple[list[int], list[Completion], int]:
        """Single-turn: the prompt ids of `task`, `n` completions of it sampled in one engine call
        (with the group's `seed`, as the prompt's `SamplingParams.seeds`), and the weight version
        that sampled them."""
        prompt, images = prompt_of(self.engine, task, self.chat)
        self.episodes_in_flight += n
        try:
            completions, version = await self._request(prompt, n, self.params.max_new_tokens, seed, images)
            return prompt, completions, version
        finally:
            self.episodes_in_flight -= n
            self.stats["episodes"] += n

    async def _episode(self, task: Task, seed: tuple[int, int] | None) -> Episode:
        """One episode; `seed`: (the group's seed, the episode's index in the group), or None."""
        env = self.env()
        try:
            try:
                observation = check_observation(env, await self._env_call(env, "reset", task))
                prompt = await self._shown(env, observation, lambda: self.encoder.first(task, observation),
                                           pictured=bool(task.images))
                e = Episode.start(task, env, prompt)
            except EnvFailure as f:
                return failed_episode(task, env, f)
            try:
                while e.finish_reason is None:
                    if e.length >= self.limits.max_total_tokens:
                        e.finish_reason = MAX_TOTAL_TOKENS
                        break
                    budget = min(self.params.max_new_tokens, self.limits.max_total_tokens - e.length)
                    completion, version = await self._model_turn(
                        e, budget, None if seed is None else turn_seed(*seed, len(e.turns)))
                    turn = model_turn(e, completion, budget, self.params.max_new_tokens, self.engine.tokenizer,
                                      version)
                    if turn is None:
                        break
                    result = check_result(env, await self._env_call(env, "step", turn.text), task)
                    between = None
                    if not result[2] and len(e.turns) < self.limits.max_turns:
                        between = await self._shown(env, result[0], lambda: self.encoder.next(result[0], turn.ids[-1]))
                    answer(e, turn, result, self.encoder, self.limits, between)
            except EnvFailure as f:
                e.fail(f)
            return e
        finally:
            self.stats["episodes"] += 1
            try:
                if getattr(env, "close", None) is not None:
                    await self._env_call(env, "close")
            except EnvFailure as f:  # as `episodes.close_env`: logged, never raised
                log.warning("%s", f)

    async def _shown(self, env: Environment, observation: Any, encode: Callable, pictured: bool = False):
        """`episodes.shown(env, encode)`; in the environments' pool when the observation (or the task,
        `pictured`) shows images, whose storing and reading go to S3, not on the event loop."""
        if pictured or not isinstance(observation, str) and observation.images:
            return await asyncio.get_running_loop().run_in_executor(self._env_pool, shown, env, encode)
        return shown(env, encode)

    async def _env_call(self, env: Environment, method: str, *args) -> Any:
        fn = getattr(env, method)
        name = f"{type(env).__name__}.{method}"
        self.env_in_flight += 1
        try:
            if inspect.iscoroutinefunction(fn):
                pending = fn(*args)
            else:
                pending = asyncio.get_running_loop().run_in_executor(self._env_pool, functools.partial(fn, *args))
            out = await asyncio.wait_for(pending, self.step_timeout_s)
            if inspect.isawaitable(out):  # a plain function that returned a coroutine
                out = await asyncio.wait_for(out, self.step_timeout_s)
            return out
        except asyncio.TimeoutError:
            raise EnvFailure(ENV_TIMEOUT, f"{name} took longer than {self.step_timeout_s:g} s "
                                          f"(explorer.env.step_timeout_s)") from None
        except Exception as exc:
            raise EnvFailure(ENV_ERROR, f"{name} raised {exc!r}") from exc
        finally:
            self.env_in_flight -= 1

    async def _model_turn(self, e: Episode, budget: int, seed: int | None = None):
        """(completion, version) of the episode's next model turn, sampled with up to `budget` tokens."""
        (completion,), version = await self._request(e.prompt_ids + e.response_ids, 1, budget, seed, e.pictures or None)
        return completion, version

    async def _request(self, ids: list[int], n: int, budget: int, seed: int | None = None,
                       images: list | None = None) -> tuple[list[Completion], int]:
        if self.failed is not None:
            raise RuntimeError("the engine failed") from self.failed
        future = asyncio.get_running_loop().create_future()
        self._ready.append(_Request(ids, n, budget, future, seed, images))
        self._wake.set()
        return await future

    # ---- the engine ------------------------------------------------------------------------------
    async def _feed(self) -> None:
        try:
            while True:
                if not self._ready:
                    # nothing to generate: the episodes the last call answered take their turns into
                    # their environments first, then the wait is theirs (env), admission's (reserve)
                    # or nobody's (idle)
                    await asyncio.sleep(0)
                    if self._ready:
                        continue
                    t0 = time.monotonic()
                    stage = "env_s" if self.env_in_flight else "reserve_s" if self.opening() else "idle_s"
                    self._wake.clear()
                    try:
                        await self._wake.wait()
                    finally:  # a wait that close() cuts short counts too
                        self.stats[stage] += time.monotonic() - t0
                    continue
                await self._gather_stragglers()
                if self.before_generate is not None:
                    loaded = await self.on_engine(self.before_generate)
                    if loaded is not None:
                        self.stats["load_s"] += loaded
                batch = self._calling = self._take()
                n = batch[0].n
                seeded = all(r.seed is not None for r in batch)  # an explorer seeds all its groups, or none
                call = dataclasses.replace(self.params, n=n, max_new_tokens=max(r.budget for r in batch),
                                           seed=None if self.params.seed is None else self.params.seed + self._calls,
                                           seeds=[r.seed for r in batch] if seeded else None)
                self._calls += 1
                images = [r.images or [] for r in batch] if any(r.images for r in batch) else None
                outputs, seconds = await self.on_engine(self._generate, [r.ids for r in batch], call, images)
                self.stats["generate_s"] += seconds
                self.stats["generate_calls"] += 1
                self.stats["turns"] += len(batch)
                version = self.engine.version
                for r, completions in zip(batch, outputs):
                    if not r.future.done():
                        r.future.set_result((completions, version))
                self._calling = []
        except asyncio.CancelledError:
            self._fail(RuntimeError("the scheduler closed"))
            raise
        except BaseException as exc:
            self._fail(exc)
            raise

    def _take(self) -> list[_Request]:
        """The next call's requests, first come first served: those of the first one's `n` (a
        workflow asks for one n anyway), up to `max_rows` sequences (at least one request)."""
        n, rows, batch, rest = self._ready[0].n, 0, [], []
        for r in self._ready:
            if r.n == n and (not batch or self.max_rows is None or rows + n <= self.max_rows):
                batch.append(r)
                rows += n
            else:
                rest.append(r)
        self._ready = rest
        return batch

    def _generate(self, prompts: list[list[int]], call: SamplingParams, images: list[list] | None = None):
        """In the engine's thread: the completions, and the seconds the engine took (not the wait for the thread)."""
        t0 = time.monotonic()
        out = self.engine.generate(prompts, call, **({} if images is None else {"images": images}))
        return out, time.monotonic() - t0

    async def _gather_stragglers(self) -> None:
        """Wait up to `batch_wait_s` while environment calls are in flight, so that episodes a
        fast tool answers now share this call instead of making their own."""
        deadline = time.monotonic() + self.batch_wait_s
        while self.env_in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.001)

    def _fail(self, exc: BaseException) -> None:
        self.failed = exc
        for r in self._ready + self._calling:
            if not r.future.done():
                r.future.set_exception(RuntimeError(f"the engine failed: {exc!r}"))
        self._ready, self._calling = [], []


def play_all(engine: RolloutEngine, tasks: list[Task], params: SamplingParams, *, env: Callable[[], Environment],
             limits: TurnLimits, chat: bool = False, env_threads: int = 16,
             step_timeout_s: float = 60.0, stats: dict | None = None) -> list[list[Episode]]:
    """`run_episodes`' contract, scheduled one by one: `params.n` finished episodes of each task, in
    task order (what a multi-turn workflow, and so the eval, plays with `scheduling: per_episode`).
    Runs its own event loop: call it where none runs (a role's main thread, the engine's thread).
    `stats["env_s"]` grows by the time the engine waited for environments."""

    async def go() -> list[list[Episode]]:
        s = EpisodeScheduler(engine, params, env=env, limits=limits, chat=chat, env_threads=env_threads,
                             step_timeout_s=step_timeout_s)
        s.start()
        try:
            seeds = params.seeds or [None] * len(tasks)
            return list(await asyncio.gather(*(s.play(task, params.n, seed) for task, seed in zip(tasks, seeds))))
        finally:
            await s.close()
            if stats is not None:
                stats["env_s"] = stats.get("env_s", 0.0) + s.stats["env_s"]

    return asyncio.run(go())
