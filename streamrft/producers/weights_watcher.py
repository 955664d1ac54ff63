"""Follows the weights topic in a background thread and prefetches each new version.

The download and the checksum verification happen here, while the explorer keeps generating;
the explorer only swaps the already-verified state dict in between two generations.
"""
from __future__ import annotations

import logging
import threading
from pathlib import Path

from confluent_kafka import TopicPartition
from minio.error import S3Error

from streamrft.config import KafkaConfig
from streamrft.infra.kafka import make_consumer
from streamrft.infra.objectstore import CorruptVersionError, WeightStore
from streamrft.schemas import DecodeError, WeightVersion, decode, topic_name

log = logging.getLogger(__name__)


class WeightsWatcher:
    def __init__(self, kafka: KafkaConfig, namespace: str, store: WeightStore, model: str, store_key: str,
                 cache_dir: Path, current_version: int = 0):
        self.kafka, self.topic, self.store, self.model = kafka, topic_name(namespace, "weights"), store, model
        self.store_key = store_key  # <namespace>/<model>: where the versions live in the bucket
        self.cache_dir = Path(cache_dir)
        self.latest_announced = current_version
        self._loaded_version = current_version
        self._ready: tuple[int, dict] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="weights-watcher", daemon=True)
        self.fetch_errors = 0

    def start(self) -> "WeightsWatcher":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def take(self) -> tuple[int, dict] | None:
        """The newest verified (version, state_dict) not yet taken, or None."""
        with self._lock:
            ready, self._ready = self._ready, None
        if ready is not None:
            self._loaded_version = ready[0]
        return ready

    def _run(self) -> None:
        from streamrft.engine.weights import fetch_state_dict

        consumer = make_consumer(self.kafka, None)
        consumer.assign([TopicPartition(self.topic, 0, 0)])  # compacted: the whole topic is small
        try:
            while not self._stop.is_set():
                msgs = consumer.consume(100, timeout=0.5)
                newest = None
                for m in msgs:
                    if m.error() is not None:
                        continue
                    try:
                        wv = decode(m.value(), WeightVersion)
                    except DecodeError as e:
                        log.warning("bad record on %s offset %d: %s", self.topic, m.offset(), e)
                        continue
                    if wv.model == self.model and (newest is None or wv.version > newest.version):
                        newest = wv
                if newest is None or newest.version <= max(self.latest_announced, self._loaded_version):
                    continue
                self.latest_announced = newest.version
                try:
                    state = fetch_state_dict(self.store, self.store_key, newest.version, self.cache_dir)
                except (CorruptVersionError, S3Error, OSError) as e:
                    # a version overwritten mid-read by a restarted trainer: the next announce fixes it
                    self.fetch_errors += 1
                    log.warning("could not fetch %s v%d: %s", self.model, newest.version, e)
                    continue
                with self._lock:
                    self._ready = (newest.version, state)
        finally:
            consumer.close()
