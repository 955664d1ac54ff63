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
"""
from __future__ import annotations

import logging
import threading
import time
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
                 cache_dir: Path, current_version: int = 0):
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
            ready, self._ready = self._ready, None
        if ready is not None:
            self._loaded_version = ready[0]
        return ready

    @property
    def has_ready(self) -> bool:
        """A verified version is waiting to be taken."""
        return self._ready is not None

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
        newest = None
        for _, wv in decoded(msgs, self.topic, WeightVersion):
            if wv.model == self.model and (newest is None or wv.version > newest):
                newest = wv.version
        return newest

    def _run(self) -> None:
        from streamrft.engine.weights import fetch_state_dict

        consumer = make_consumer(self.kafka, None, loop_path=True)
        consumer.assign([TopicPartition(self.topic, 0, 0)])  # compacted: the whole topic is small
        wanted, next_try, delay = None, 0.0, 0.5  # the newest announced version not loaded yet
        try:
            while not self._stop.is_set():
                wait = 0.5 if wanted is None else min(0.5, max(0.0, next_try - time.monotonic()))
                newest = self._newest(consume_ready(consumer, 100, wait))
                if newest is not None and newest > max(self.latest_announced, self._loaded_version):
                    self.latest_announced = wanted = newest
                    next_try, delay = 0.0, 0.5
                if wanted is None or time.monotonic() < next_try:
                    continue
                try:
                    t0 = time.monotonic()
                    state, meta = fetch_state_dict(self.store, self.store_key, wanted, self.cache_dir, self._have)
                    self.fetch_s += time.monotonic() - t0
                except FETCH_ERRORS as e:
                    self.fetch_errors += 1
                    log.warning("could not fetch %s v%d (%s: %s); retrying in %.1fs", self.model, wanted,
                                type(e).__name__, e, delay)
                    next_try, delay = time.monotonic() + delay, min(delay * 2, self.retry_max_s)
                    continue
                lora = LoraSpec.from_manifest(meta)
                self._have = (wanted, state) if lora is None and "full_every" in meta else None
                with self._lock:
                    # a dict of its own: the taker may add or drop names, the tensors are only read
                    self._ready = (wanted, dict(state), lora)
                wanted = None
        except BaseException as e:
            self.failed = e
            log.error("weights watcher stopped: %s: %s", type(e).__name__, e)
            raise
        finally:
            consumer.close()
