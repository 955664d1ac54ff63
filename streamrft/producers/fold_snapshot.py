"""Snapshots of the explorers' folds of `<ns>.admission` and `<ns>.task-stats`: a fold that starts
reads the newest snapshot and the records after it, never the whole topic from offset 0.

Every explorer folds both topics in the same order, so a fold's state after the records before
offsets N (one per partition) is the same in every process, and any of them may write it:
`s3://<bucket>/<ns>/folds/<name>.msgpack` holds `{next: {partition: N}, state: ...}` (msgpack; each
fold names its own state), rewritten by whichever explorer last folded `min_records` records past
it, at most every `every_s`. A process that starts reads it and assigns each partition at its N; a
missing or unreadable snapshot is a fold from offset 0, as before. A snapshot is bounded: each fold
counts a group once among the newest 50,000 group ids (`once.OnceWindow`), not among all of the
run's; one object per fold, rewritten in place.
"""
from __future__ import annotations

import io
import logging
import time

import msgpack

from streamrft.config import S3Config
from streamrft.infra.objectstore import make_client, read_object

log = logging.getLogger(__name__)

EVERY_S = 30.0
MIN_RECORDS = 1000


class FoldSnapshots:
    def __init__(self, s3: S3Config, namespace: str, every_s: float = EVERY_S, min_records: int = MIN_RECORDS):
        self.client, self.bucket = make_client(s3), s3.bucket
        self.prefix = f"{namespace}/folds/"
        self.every_s, self.min_records = every_s, min_records
        self._saved: dict[str, tuple[int, float]] = {}  # name -> (next offset saved, when)

    def key(self, name: str) -> str:
        return f"{self.prefix}{name}.msgpack"

    def load(self, name: str) -> tuple[dict[int, int], dict] | None:
        """({partition: next offset}, state) of fold `name`'s snapshot; None: fold from offset 0."""
        try:
            raw = msgpack.unpackb(read_object(self.client, self.bucket, self.key(name)), strict_map_key=False)
            nxt = raw.get("next") if isinstance(raw, dict) else None
            if not isinstance(nxt, dict) or not all(isinstance(p, int) and isinstance(o, int) and p >= 0 and o >= 0
                                                    for p, o in nxt.items()) or not isinstance(raw.get("state"), dict):
                raise ValueError("not a fold snapshot")
        except Exception as e:  # none yet (NoSuchKey), the store away, or a corrupt object
            if getattr(e, "code", None) != "NoSuchKey":
                log.warning("fold snapshot %s unreadable (%s: %s): folding from offset 0", name, type(e).__name__, e)
            return None
        self._saved[name] = (sum(nxt.values()), time.monotonic())
        return nxt, raw["state"]

    def due(self, name: str, next_offsets: dict[int, int]) -> bool:
        saved, at = self._saved.get(name, (0, 0.0))
        return sum(next_offsets.values()) - saved >= self.min_records and time.monotonic() - at >= self.every_s

    def save(self, name: str, next_offsets: dict[int, int], state: dict) -> None:
        """Write the fold's state after the records before `next_offsets`. A failure is logged: the
        fold goes on, and a later start reads an older snapshot or the topic from 0."""
        data = msgpack.packb({"next": next_offsets, "state": state})
        try:
            self.client.put_object(self.bucket, self.key(name), io.BytesIO(data), len(data),
                                   content_type="application/msgpack")
            self._saved[name] = (sum(next_offsets.values()), time.monotonic())
        except Exception as e:
            self._saved[name] = (self._saved.get(name, (0, 0.0))[0], time.monotonic())  # not again at once
            log.warning("fold snapshot %s not written: %s: %s", name, type(e).__name__, e)
