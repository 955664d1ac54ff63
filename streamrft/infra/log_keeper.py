"""Keeps the embedded broker's partitions few objects long: rolls small batch objects up into large ones.

Tansu 0.6 on S3 stores each produce request as one object, `.../partitions/<p>/records/<base
offset>.batch`, and every fetch lists all of a partition's objects before it reads (SeaweedFS
lists ~1,000 objects per 150 ms here) and gives up listing at the fetch's max wait. A partition of
a few thousand requests answers fetches slower and slower; past ~15,000 a consumer reads nothing
(`benchmarks/broker_growth.py`). The keeper runs beside the broker (`EmbeddedStack` starts it as a
third process) and, every `every_s`, merges each run of older small objects of a partition into
objects of up to `target_bytes` (`segments.merge`: every record's offset, timestamp, key, value and
headers kept), so a partition holds about bytes / `target_bytes` objects however many requests
wrote it. Objects older than `settled_after_s` are merged once more, into objects of up to
`settled_bytes`: an hour of a fast loop's rollouts is a few hundred MiB a partition, and at 1 MiB
each its fetches listed 330 objects (docs/broker-growth.md). Such a merge waits until its settled
objects make one of at least half `settled_bytes`, so a byte is rewritten once in that tier. Only objects older than `min_age_s` are touched, and a merge stops at a batch that does
not follow the one before it: the broker writes a batch's object after giving it its offsets, so a
neighbour may still be missing (`offset_gaps.py`), and no merged object may span its hole.

A roll-up writes the merged object over the first object's name, then deletes the others in one
request. A fetch that lists the partition between the two can return the merged records and the old
copies after them: records delivered twice, which every streamrft reader tolerates (delivery is
at-least-once) and guarded readers drop (`offset_gaps.take_contiguous`: an offset at or below one
already taken since the reader was positioned). A keeper killed between the
two leaves copies inside a merged object's range; its journal names them and the next pass deletes
them first.
"""
from __future__ import annotations

import argparse
import logging
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from streamrft.config.stack import LogKeeperConfig
from streamrft.infra.objectstore import read_object
from streamrft.infra.segments import HEADER, BatchError, merge, parse_batch

log = logging.getLogger(__name__)

DEFAULTS = LogKeeperConfig()  # `stack.log_keeper`'s defaults, the keeper's own when run by hand
CLUSTER = "tansu_cluster"
READERS = 8  # concurrent GETs of a run's objects
PENDING = "streamrft-log-keeper/pending.json"  # the roll-up in progress: the names it deletes after its write


@dataclass
class KeeperStats:
    passes: int = 0
    merged_objects: int = 0  # small objects rolled up
    written_objects: int = 0  # merged objects written
    leftovers_deleted: int = 0  # copies an interrupted roll-up left
    unmergeable: int = 0  # compressed / transactional / control / unreadable batches left as they are
    errors: int = 0
    objects: dict[str, int] = field(default_factory=dict)  # partition prefix -> objects after the last pass
    list_s: float = 0.0  # the last pass's listing of the bucket, seconds


@dataclass
class _Obj:
    name: str
    base: int
    size: int
    modified: float


DUTY_REST = 4.0
"""Seconds of rest after a pass, per second its listing of the bucket took (at least `every_s`)."""


def rest_after(stats: KeeperStats, every_s: float) -> float:
    """The wait before the next pass. It grows with the listing (a bucket of many topics: a test
    session's), never with the merging: merging is the work the broker's writes made, and a
    keeper that rested 4x a long merge fell behind for good (a pass of 7,161 objects took 287 s
    and was followed by 19 minutes of rest while partitions grew by thousands of objects)."""
    return max(every_s, DUTY_REST * stats.list_s)


def _base(name: str) -> int:
    return int(name.rsplit("/", 1)[1][:20])


class LogKeeper:
    """Roll-ups over the broker's bucket, through a minio client (`client`)."""

    def __init__(self, client, bucket: str = "tansu", min_age_s: float = DEFAULTS.min_age_s,
                 target_bytes: int = DEFAULTS.target_bytes, min_run: int = DEFAULTS.min_run,
                 cluster: str = CLUSTER, journal: str = PENDING,
                 settled_after_s: float = DEFAULTS.settled_after_s, settled_bytes: int = DEFAULTS.settled_bytes):
        self.client, self.bucket, self.journal = client, bucket, journal
        self._pool = ThreadPoolExecutor(READERS, thread_name_prefix="log-keeper")
        self.min_age_s, self.target_bytes, self.min_run = min_age_s, target_bytes, min_run
        self.settled_after_s, self.settled_bytes = settled_after_s, max(settled_bytes, target_bytes)
        self.root = f"clusters/{cluster}/topics/"
        self.stats = KeeperStats()

    # ---- the layout --------------------------------------------------------------------------
    def partitions(self) -> list[str]:
        """Every partition's records prefix in the bucket."""
        out = []
        for t in self.client.list_objects(self.bucket, prefix=self.root):
            if not t.is_dir:
                continue
            for p in self.client.list_objects(self.bucket, prefix=t.object_name + "partitions/"):
                if p.is_dir:
                    out.append(p.object_name + "records/")
        return sorted(out)

    def layout(self) -> dict[str, list[_Obj]]:
        """Every partition's records prefix and its objects, in offset order, from one recursive
        listing of the bucket (1,000 keys a request): a pass costs requests in proportion to the
        objects there are, not two per topic and one per partition, which a broker holding
        hundreds of small topics (a test session's namespaces) paid every few seconds."""
        out: dict[str, list[_Obj]] = {}
        for o in self.client.list_objects(self.bucket, prefix=self.root, recursive=True):
            name = o.object_name
            if not name.endswith(".batch") or "/records/" not in name:
                continue
            prefix = name[:name.index("/records/") + len("/records/")]
            out.setdefault(prefix, []).append(_Obj(name, _base(name), o.size,
                                                   o.last_modified.timestamp() if o.last_modified else time.time()))
        for objs in out.values():
            objs.sort(key=lambda o: o.name)
        return dict(sorted(out.items()))

    def objects(self, prefix: str) -> list[_Obj]:
        return [_Obj(o.object_name, _base(o.object_name), o.size,
                     o.last_modified.timestamp() if o.last_modified else time.time())
                for o in self.client.list_objects(self.bucket, prefix=prefix, recursive=True)
                if o.object_name.endswith(".batch")]

    def _read(self, name: str, length: int = 0) -> bytes:
        return read_object(self.client, self.bucket, name, length=length)

    def _delete(self, names: list[str]) -> None:
        """One DELETE per object, `READERS` at a time. SeaweedFS answers a multi-object delete one
        object after another, 20-60 ms each under a run's load: that request took 56 % of a pass
        and capped the keeper near the rate a run writes objects. In parallel: ~5 ms an object.
        (Deleting an object already gone is no error in S3: a retried pass may repeat one.)"""
        list(self._pool.map(lambda n: self.client.remove_object(self.bucket, n), names))

    # ---- one partition -------------------------------------------------------------------------
    def roll_up(self, prefix: str, now: float | None = None, objs: list[_Obj] | None = None) -> int:
        """One pass over one partition (its objects as listed, or listed now); returns its object
        count after it."""
        now = time.time() if now is None else now
        objs = self.objects(prefix) if objs is None else objs
        runs = self.plan(objs, now)
        left = len(objs)
        for r in runs:
            left -= self._merge_run(r)
        return left

    def plan(self, objs: list[_Obj], now: float) -> list[list[_Obj]]:
        """The runs of a partition's objects (in offset order) that one pass merges.

        The first and the newest objects are never touched. The broker answers ListOffsets
        EARLIEST with the object of the oldest last-modified time, and a merged object is new:
        merging the first away would move every new consumer group's start (and `read_topic`'s)
        past the records before it. The broker's next write lands after the newest.

        Two tiers: small objects merge into objects of up to `target_bytes`, once a partition has
        `min_run` of them; merged objects older than `settled_after_s` merge again into objects of
        up to `settled_bytes`, once there are enough of them to make one of at least half that (so a
        byte is rewritten once in that tier, not each time a settled neighbour joins it)."""
        small: list[list[_Obj]] = []
        settled: list[list[_Obj]] = []
        run: list[_Obj] = []
        size, limit = 0, 0  # of `run`, and the size its tier merges up to

        def close():
            if len(run) < 2:
                return
            if limit == self.target_bytes:
                small.append(run)
            elif size >= self.settled_bytes // 2:
                settled.append(run)

        for o in objs[1:-1]:
            age = now - o.modified
            if age < self.min_age_s:
                break  # everything after it is younger still (offsets are given in time order)
            if o.size < self.target_bytes // 2:
                tier = self.target_bytes
            elif o.size < self.settled_bytes // 2 and age >= self.settled_after_s:
                tier = self.settled_bytes
            else:
                tier = 0  # full in its tier, or not settled yet: left as it is
            if not tier or (run and (tier != limit or size + o.size > limit)):
                close()
                run, size = [], 0
            if tier:
                run.append(o)
                size, limit = size + o.size, tier
        close()
        if sum(len(r) for r in small) < self.min_run:
            small = []
        return sorted(small + settled, key=lambda r: r[0].base)

    def finish_pending(self) -> None:
        """Delete the copies a roll-up interrupted between its write and its delete left (its journal)."""
        import json

        try:
            pending = json.loads(self._read(self.journal))
        except Exception as e:  # no journal: nothing was interrupted
            if getattr(e, "code", None) not in ("NoSuchKey", None):
                raise
            return
        # only once the merged object was written: before that, the copies are the only ones
        last = _base(pending["first"]) + HEADER.unpack_from(self._read(pending["first"], HEADER.size))[6]
        if last >= pending["last_offset"]:
            self._delete(pending["rest"])
            self.stats.leftovers_deleted += len(pending["rest"])
            log.warning("deleted %d copies an interrupted roll-up left (after %s)", len(pending["rest"]),
                        pending["first"])
        self.client.remove_object(self.bucket, self.journal)

    def _merge_run(self, run: list[_Obj]) -> int:
        """Merge one run (split where a batch cannot be merged); returns how many objects went away."""
        import json

        batches, gone = [], 0
        # the reads wait on S3 round trips, not on this process: a few at a time
        datas = list(self._pool.map(lambda o: self._read(o.name), run))
        for o, data in zip(run + [None], datas + [None]):
            batch = None
            if o is not None:
                try:
                    batch = parse_batch(data, o.base)
                except BatchError as e:
                    log.warning("%s left as it is: %s", o.name, e)
                if batch is None or not batch.mergeable:
                    self.stats.unmergeable += 1
            contiguous = not batches or batch is None or batch.base_offset == batches[-1][1].last_offset + 1
            if batch is not None and batch.mergeable and contiguous:
                batches.append((o, batch))
                continue
            if len(batches) > 1:
                data = merge([b for _, b in batches])
                first = batches[0][0].name
                rest = [x.name for x, _ in batches[1:]]
                journal = json.dumps({"first": first, "last_offset": batches[-1][1].last_offset,
                                      "rest": rest}).encode()
                self.client.put_object(self.bucket, self.journal, _Bytes(journal), len(journal))
                self.client.put_object(self.bucket, first, _Bytes(data), len(data))
                self._delete(rest)
                self.client.remove_object(self.bucket, self.journal)
                self.stats.merged_objects += len(batches)
                self.stats.written_objects += 1
                gone += len(batches) - 1
            # a batch after a hole (a request whose offsets the broker gave out and whose object
            # is not written yet) starts the next merge: no object ever spans a hole
            batches = [(o, batch)] if batch is not None and batch.mergeable and not contiguous else []
        return gone

    # ---- every partition ------------------------------------------------------------------------
    def run_pass(self, stop: threading.Event | None = None) -> KeeperStats:
        """One roll-up of every partition; `stop` ends it between two partitions."""
        self.stats.passes += 1
        try:
            self.finish_pending()
        except Exception as e:
            self.stats.errors += 1
            log.warning("finishing an interrupted roll-up failed: %s: %s", type(e).__name__, e)
            return self.stats
        now = t0 = time.time()
        layout = self.layout()
        self.stats.list_s = time.time() - t0
        for prefix, objs in layout.items():
            if stop is not None and stop.is_set():
                break
            try:
                self.stats.objects[prefix] = self.roll_up(prefix, now, objs)
            except Exception as e:  # S3 restarting, a topic deleted meanwhile: the next pass retries
                self.stats.errors += 1
                log.warning("roll-up of %s failed: %s: %s", prefix, type(e).__name__, e)
        return self.stats


class _Bytes:
    """A readable stream over bytes (minio's put_object wants one)."""

    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def read(self, n: int = -1) -> bytes:
        end = len(self.data) if n is None or n < 0 else self.pos + n
        out = self.data[self.pos:end]
        self.pos += len(out)
        return out


def main(argv: list[str] | None = None) -> int:
    """`python -m streamrft.infra.log_keeper --s3 HOST:PORT ...`: passes until SIGTERM."""
    from minio import Minio

    from streamrft.infra.stack import S3_KEY, TANSU_BUCKET

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--s3", required=True, help="host:port of the broker's S3 store")
    ap.add_argument("--bucket", default=TANSU_BUCKET)
    ap.add_argument("--every-s", type=float, default=DEFAULTS.every_s)
    ap.add_argument("--min-age-s", type=float, default=DEFAULTS.min_age_s)
    ap.add_argument("--target-bytes", type=int, default=DEFAULTS.target_bytes)
    ap.add_argument("--min-run", type=int, default=DEFAULTS.min_run)
    ap.add_argument("--settled-after-s", type=float, default=DEFAULTS.settled_after_s)
    ap.add_argument("--settled-bytes", type=int, default=DEFAULTS.settled_bytes)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s log-keeper %(levelname)s %(message)s")
    keeper = LogKeeper(Minio(args.s3, access_key=S3_KEY, secret_key=S3_KEY, secure=False), args.bucket,
                       args.min_age_s, args.target_bytes, args.min_run,
                       settled_after_s=args.settled_after_s, settled_bytes=args.settled_bytes)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    wait = args.every_s
    while not stop.wait(wait):
        before, t0 = keeper.stats.merged_objects, time.monotonic()
        try:
            keeper.run_pass(stop)
        except Exception as e:  # S3 restarting (listing the partitions failed): the next pass retries
            keeper.stats.errors += 1
            log.warning("pass %d failed: %s: %s", keeper.stats.passes, type(e).__name__, e)
            continue
        finally:
            # a listing that takes long (a bucket of many topics) is followed by a longer rest: the
            # listing's cost to the keeper and the S3 server stays under a fifth of a core
            wait = rest_after(keeper.stats, args.every_s)
        if keeper.stats.merged_objects > before:
            log.info("pass %d: rolled %d objects up in %.1f s; largest partition now %d objects",
                     keeper.stats.passes, keeper.stats.merged_objects - before, time.monotonic() - t0,
                     max(keeper.stats.objects.values(), default=0))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
