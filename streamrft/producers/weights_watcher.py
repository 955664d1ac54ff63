"""Follows the weights topic in a background thread and prefetches each new version.

The download and the checksum verification happen here, while the explorer keeps generating;
the explorer only swaps the already-verified state dict in between two generations. A fetch
that fails (S3 restarting, a corrupt object) is retried with backoff until it succeeds or a
newer version is announced: with `max_staleness: 0` the explorer cannot go on without it.
`latest_announced` is the newest version announced, loaded or not (explorers' admission).
Delta versions (`trainer.weight_sync.delta`, `engine.delta`) are applied onto the last version
verified here (kept for that), else rebuilt from their chain's full snapshot; a chain that cannot be
built (a corrupt or missing delta) is retried like any failed fetch, and the next full snapshot
gets past it. A watcher started afresh (an explorer restart) replays from the newest snapshot.
With `every` (the evaluator's `eval.schedule: fixed`) it takes, instead of the newest version, every
announced version divisible by `every`, in order, and queues each one verified: `take` hands them
out oldest first, so a slow taker falls behind rather than skipping any. A scheduled version the
store no longer has (garbage-collected before it was fetched) is skipped and counted.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from pathlib import Path

from confluent_kafka import TopicPartition
from minio.error import S3Error

from streamrft.config import KafkaConfig, LoraSpec
from streamrft.infra.kafka import consume_ready, decoded, make_consumer
from streamrft.infra.objectstore import CorruptVersionError, StoreUnavailableError, WeightStore
from streamrft.schemas import WeightVersion, topic_name

log = logging.getLogger(__name__)

# what a fetch may fail with and still succeed later: S3 down (after the store's own retries), a
# version missing or half-overwritten, a local disk hiccup
FETCH_ERRORS = (CorruptVersionError, StoreUnavailableError, S3Error, OSError)


class WeightsWatcher:
    def __init__(self, kafka: KafkaConfig, namespace: str, store: WeightStore, model: str, store_key: str,
                 cache_dir: Path, current_version: int = 0, every: int | None = None):
        self.kafka, self.topic, self.store, self.model = kafka, topic_name(namespace, "weights"), store, model
        self.store_key = store_key  # <namespace>/<model>: where the versions live in the bucket
        self.cache_dir = Path(cache_dir)
        self.latest_announced = current_version
        self._loaded_version = current_version
        self._ready: tuple[int, dict, LoraSpec | None] | None = None
        # the last full-weight version verified, kept when the run publishes deltas (its meta has
        # `full_every`): the next delta is applied onto it (`engine.delta`); one more copy of the weights
        self._have: tuple[int, dict] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="weights-watcher", daemon=True)
        self.fetch_errors = 0
        self.fetch_s = 0.0  # seconds spent downloading and verifying versions (this thread's)
        self.failed: BaseException | None = None  # what stopped the thread, raised by take()
        self.retry_max_s = 30.0  # the longest wait between two fetches of one version
        self.every = every  # a fixed schedule: every version divisible by it, in order (None: the newest)
        self._queue: deque[tuple[int, dict, LoraSpec | None]] = deque()  # fixed schedule: verified, in order
        self._scheduled: deque[int] = deque()  # fixed schedule: announced, not fetched yet
        self.skipped = 0  # fixed schedule: versions gone from the store before they were fetched
        self._scheduled_up_to = current_version  # fixed schedule: the newest version scheduled

    def start(self) -> "WeightsWatcher":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def take(self) -> tuple[int, dict, LoraSpec | None] | None:
        """The newest verified (version, state_dict, its LoRA spec or None for full weights) not yet
        taken, or None."""
        if self.failed is not None:
            raise RuntimeError("the weights watcher stopped") from self.failed
        with self._lock:
            if self.every:
                ready = self._queue.popleft() if self._queue else None
            else:
                ready, self._ready = self._ready, None
        if ready is not None:
            self._loaded_version = ready[0]
        return ready

    @property
    def has_ready(self) -> bool:
        """A verified version is waiting to be taken."""
        return bool(self._queue) if self.every else self._ready is not None

    @property
    def queued(self) -> int:
        """Fixed schedule: versions verified and waiting to be taken."""
        return len(self._queue)

    def swap_into(self, engine) -> float | None:
        """Load the newest verified version not yet taken into `engine` (its live weights); the
        seconds that took, or None when there was none."""
        ready = self.take()
        if ready is None:
            return None
        version, state, lora = ready
        t0 = time.monotonic()
        engine.load_weights(state, version, lora)
        return time.monotonic() - t0

    def _newest(self, msgs) -> int | None:
        return max(self._versions(msgs), default=None)

    def _versions(self, msgs) -> list[int]:
        return [wv.version for _, wv in decoded(msgs, self.topic, WeightVersion) if wv.model == self.model]

    def _next_wanted(self, msgs) -> int | None:
        """The version to fetch next, from what was read: the newest (the default), or with `every`
        the oldest scheduled version not fetched yet."""
        if not self.every:
            newest = self._newest(msgs)
            if newest is not None and newest > max(self.latest_announced, self._loaded_version):
                self.latest_announced = newest
                return newest
            return None
        for v in sorted(set(self._versions(msgs))):
            self.latest_announced = max(self.latest_announced, v)
            if v > self._scheduled_up_to and v % self.every == 0:
                self._scheduled.append(v)
                self._scheduled_up_to = v
        return None

    def _run(self) -> None:
        from streamrft.engine.weights import fetch_state_dict

        consumer = make_consumer(self.kafka, None, loop_path=True)
        consumer.assign([TopicPartition(self.topic, 0, 0)])  # compacted: the whole topic is small
        wanted, next_try, delay = None, 0.0, 0.5  # the newest announced version not loaded yet
        try:
            while not self._stop.is_set():
                wait = 0.5 if wanted is None else min(0.5, max(0.0, next_try - time.monotonic()))
                newer = self._next_wanted(consume_ready(consumer, 100, wait))
                if newer is not None:
                    wanted, next_try, delay = newer, 0.0, 0.5
                if self.every and wanted is None and self._scheduled:
                    wanted, next_try, delay = self._scheduled[0], 0.0, 0.5
                if wanted is None or time.monotonic() < next_try:
                    continue
                try:
                    t0 = time.monotonic()
                    state, meta = fetch_state_dict(self.store, self.store_key, wanted, self.cache_dir, self._have)
                    self.fetch_s += time.monotonic() - t0
                except FETCH_ERRORS as e:
                    self.fetch_errors += 1
                    if self.every and isinstance(e, S3Error) and e.code == "NoSuchKey":
                        log.warning("%s v%d is gone from the store: skipped", self.model, wanted)
                        self.skipped += 1
                        self._scheduled.popleft()
                        wanted = None
                        continue
                    log.warning("could not fetch %s v%d (%s: %s); retrying in %.1fs", self.model, wanted,
                                type(e).__name__, e, delay)
                    next_try, delay = time.monotonic() + delay, min(delay * 2, self.retry_max_s)
                    continue
                lora = LoraSpec.from_manifest(meta)
                self._have = (wanted, state) if lora is None and "full_every" in meta else None
                with self._lock:
                    # a dict of its own: the taker may add or drop names, the tensors are only read
                    if self.every:
                        self._queue.append((wanted, dict(state), lora))
                        self._scheduled.popleft()
                    else:
                        self._ready = (wanted, dict(state), lora)
                wanted = None
        except BaseException as e:
            self.failed = e
            log.error("weights watcher stopped: %s: %s", type(e).__name__, e)
            raise
        finally:
            consumer.close()
