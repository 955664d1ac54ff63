"""The gateway's engine thread: concurrent requests batched into rollout-engine calls, weights
hot-swapped between calls exactly as explorers swap them.

Requests wait in a queue. After the first one the thread waits, up to `batch_wait_s`, only while
more are due: requests the server has received but not handed over yet (`arriving`), or fewer
than the last batch held (its clients are likely to come back together). A lone client never
waits. Then it runs every request alike in sampling (n, temperature, top-p, top-k, top log-probs, stop tokens) as
one `engine.generate`, each cut back to its own `max_tokens`. A seeded request runs alone, so its
samples depend on its seed only. Each result carries the weight version that generated it.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from streamrft.engine.rollout.base import Completion, RolloutEngine, SamplingParams

log = logging.getLogger(__name__)


@dataclass
class Generation:
    version: int
    completions: list[Completion]


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    images: list | None = None  # a vision-language prompt's images (PIL), in the order of its placeholders

    def key(self) -> tuple:
        p = self.params
        if p.seed is not None:
            return ("seeded", id(self))
        return (p.n, p.temperature, p.top_p, p.top_k, p.top_logprobs, tuple(p.stop_token_ids))

    def resolve(self, result: Any = None, error: BaseException | None = None) -> None:
        def set_it() -> None:
            if self.future.done():  # the client went away
                return
            if error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(result)
        self.loop.call_soon_threadsafe(set_it)


def cut(tokenizer: Any, c: Completion, max_new_tokens: int) -> Completion:
    """`c` cut back to `max_new_tokens` (it was generated within a batch allowed more)."""
    if len(c.token_ids) <= max_new_tokens:
        return c
    ids = c.token_ids[:max_new_tokens]
    return Completion(token_ids=ids, logprobs=c.logprobs[:max_new_tokens], finish_reason="length",
                      text=tokenizer.decode(ids, skip_special_tokens=True),
                      top_logprobs=None if c.top_logprobs is None else c.top_logprobs[:max_new_tokens])


class EngineWorker:
    def __init__(self, engine: RolloutEngine, take_weights: Callable[[], Any], batch_wait_s: float = 0.005,
                 max_batch: int = 64, between: Callable[[], None] | None = None,
                 arriving: Callable[[], int] = lambda: 0):
        """`take_weights()` gives (version, state, lora) or None (`WeightsWatcher.take`); `between()`
        runs between engine calls (the held-out eval); `arriving()` counts requests on their way."""
        self.engine, self.take_weights, self.between, self.arriving = engine, take_weights, between, arriving
        self._last_batch = 1
        self.batch_wait_s, self.max_batch = batch_wait_s, max_batch
        self._queue: queue.Queue[_Request] = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gateway-engine", daemon=True)
        self.failed: BaseException | None = None
        self.stats = {"engine_calls": 0, "requests": 0, "swaps": 0, "busy_s": 0.0}

    def start(self) -> "EngineWorker":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    @property
    def version(self) -> int:
        return self.engine.version

    def submit(self, prompt_ids: list[int], params: SamplingParams, images: list | None = None) -> asyncio.Future:
        """A future of `Generation` for one prompt (call from the event loop); `images`: the PIL
        images whose placeholders it holds."""
        if self.failed is not None:
            raise RuntimeError("the gateway's engine thread stopped") from self.failed
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._queue.put(_Request(prompt_ids, params, fut, loop, images))
        return fut

    def _swap(self) -> None:
        ready = self.take_weights()
        if ready is not None:
            version, state, lora = ready
            self.engine.load_weights(state, version, lora)
            self.stats["swaps"] += 1
            log.info("gateway serves v%d", version)

    def _batch(self) -> list[_Request]:
        try:
            first = self._queue.get(timeout=0.1)
        except queue.Empty:
            return []
        batch, deadline = [first], time.monotonic() + self.batch_wait_s
        while len(batch) < self.max_batch:
            try:
                batch.append(self._queue.get_nowait())
                continue
            except queue.Empty:
                pass
            left = deadline - time.monotonic()
            if left <= 0 or (len(batch) >= self._last_batch and self.arriving() <= 0):
                break
            try:
                batch.append(self._queue.get(timeout=min(left, 0.001)))
            except queue.Empty:
                pass
        self._last_batch = len(batch)
        return batch

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._swap()
                if self.between is not None:
                    self.between()
                batch = self._batch()
                by_key: dict[tuple, list[_Request]] = {}
                for r in batch:
                    by_key.setdefault(r.key(), []).append(r)
                for reqs in by_key.values():
                    self._generate(reqs)
        except BaseException as e:
            self.failed = e
            log.exception("gateway engine thread stopped")
            while True:
                try:
                    self._queue.get_nowait().resolve(error=RuntimeError(f"engine thread stopped: {e}"))
                except queue.Empty:
                    break
            raise

    def _generate(self, reqs: list[_Request]) -> None:
        params = dataclasses.replace(reqs[0].params, max_new_tokens=max(r.params.max_new_tokens for r in reqs))
        t0 = time.monotonic()
        try:
            images = [r.images or [] for r in reqs] if any(r.images for r in reqs) else None
            outputs = self.engine.generate([r.prompt_ids for r in reqs], params,
                                           **({} if images is None else {"images": images}))
        except Exception as e:  # one bad batch fails its requests, not the gateway
            log.warning("engine call failed for %d requests: %s: %s", len(reqs), type(e).__name__, e)
            for r in reqs:
                r.resolve(error=e)
            return
        finally:
            self.stats["busy_s"] += time.monotonic() - t0
        self.stats["engine_calls"] += 1
        self.stats["requests"] += len(reqs)
        for r, completions in zip(reqs, outputs):
            r.resolve(Generation(self.engine.version,
                                 [cut(self.engine.tokenizer, c, r.params.max_new_tokens) for c in completions]))
