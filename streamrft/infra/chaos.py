"""Produce and read through server crashes on the embedded stack.

`produce_through_broker_kills`: what the broker lost of the acknowledged records, the check behind
`KafkaConfig.idempotence` (its test and `benchmarks/broker_kill_durability.py`).
`read_through_server_kills`: which records a live consumer never delivered, plain and behind
`infra.offset_gaps.OffsetGaps` (its test and `benchmarks/offset_gaps.py`).
`DelayingS3Proxy`: an HTTP proxy between Tansu and its S3 store that holds some object writes back
a while, as a loaded S3 server does: the broker then lists later batches before earlier ones."""
from __future__ import annotations

import random
import threading
import time
from collections import Counter
from dataclasses import dataclass
from http.client import HTTPConnection
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from confluent_kafka import TopicPartition
from confluent_kafka.admin import NewTopic

from streamrft.config import KafkaConfig
from streamrft.infra.kafka import (DeliveryError, ensure_topics, flush_or_raise, make_consumer, make_producer,
                                   partition_ends, read_topic)
from streamrft.infra.stack import EmbeddedStack


@dataclass
class KillReport:
    acked: int
    lost: list[int]  # acknowledged, yet not on the topic
    twice: list[int]  # on the topic more than once


def produce_through_broker_kills(es: EmbeddedStack, kafka: KafkaConfig, topic: str, kills: int,
                                 seed: int = 0) -> KillReport:
    """Send records 0, 1, 2, ... one at a time, each flushed until acked, while the broker is killed
    (SIGKILL, a few ms after a produce) and restarted `kills` times; then read the topic back."""
    rng = random.Random(seed)
    ensure_topics(kafka, {topic: NewTopic(topic, num_partitions=1, replication_factor=1)})
    acked: list[int] = []
    stop, sent = threading.Event(), threading.Event()

    def produce() -> None:
        producer, i = make_producer(kafka), 0
        while not stop.is_set():
            producer.produce(topic, key=b"k", value=str(i).encode())
            sent.set()
            try:
                flush_or_raise(producer, timeout=60)
                acked.append(i)
            except DeliveryError:
                pass  # not acknowledged: not counted, may or may not be on the topic
            i += 1
            time.sleep(rng.uniform(0, 0.05))

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    try:
        for _ in range(kills):
            time.sleep(rng.uniform(1, 3))
            sent.clear()
            sent.wait(30)
            time.sleep(rng.uniform(0, 0.03))
            es.kill("tansu")
            time.sleep(rng.uniform(0, 2))
            es.restart("tansu")
        time.sleep(2)
    finally:
        stop.set()
        thread.join(120)

    (end,) = partition_ends(kafka, topic)
    consumer = make_consumer(kafka, None)
    consumer.assign([TopicPartition(topic, 0, end.start)])
    values: list[int] = []
    deadline = time.monotonic() + 60
    try:
        while len(values) < end.end - end.start and time.monotonic() < deadline:
            values += [int(m.value()) for m in consumer.consume(1000, timeout=0.5) if m.error() is None]
    finally:
        consumer.close()
    on_topic = Counter(values)
    return KillReport(acked=len(acked), lost=[i for i in acked if i not in on_topic],
                      twice=[i for i, n in on_topic.items() if n > 1])


@dataclass
class ReadReport:
    acked: int
    on_topic: int
    kills: list[str]
    missed_raw: list[int]  # offsets on the topic a plain live consumer never delivered
    missed_guarded: list[int]  # the same for the consumer behind `OffsetGaps`
    lost: list[str]  # acknowledged, yet not on the topic
    holes: list[int]  # offsets that no record fills
    gaps: dict  # the guard's counters
    fill_waits: list[float]
    replay_missed: list[int]  # offsets on the topic a guarded replay of it, afterwards, never delivered
    replay_gaps: dict  # that replay's guard's counters
    replay_skip_waits: list[float]  # how long it waited at each hole (0: passed at first sight)


def read_through_server_kills(es: EmbeddedStack, kafka: KafkaConfig, topic: str, seed: int = 0,
                              producers: int = 4, min_kills: int = 6, max_kills: int = 40, min_holes: int = 1,
                              gap_wait_s: float = 10.0, slow_puts_s: float = 0.0, duration_s: float = 0.0) -> ReadReport:
    """`producers` threads write small batches to one partition while Tansu or SeaweedFS is killed
    (SIGKILL) and restarted, at least `min_kills` times and on until the guarded consumer met
    `min_holes` holes (at most `max_kills`). Or, with `slow_puts_s`, no kills: Tansu writes to S3
    through a `DelayingS3Proxy` holding PUTs back up to that long, for `duration_s` and on until
    `min_holes` (at most 10 x `duration_s`). Two live consumers read it meanwhile: a plain one and
    one behind `OffsetGaps`. Afterwards the topic is read back whole: which of its records each
    live consumer never delivered."""
    from streamrft.infra.offset_gaps import OffsetGaps, assign_guarded, take_contiguous

    rng = random.Random(seed)
    proxy = None
    if slow_puts_s:
        proxy = DelayingS3Proxy(es.load_state().s3, max_delay_s=slow_puts_s, seed=seed)
        es.kill("tansu")
        es.tansu_s3_endpoint = proxy.url
        es.restart("tansu")
    ensure_topics(kafka, {topic: NewTopic(topic, num_partitions=1, replication_factor=1)})
    acked: list[str] = []
    stop = threading.Event()
    gaps = OffsetGaps(gap_wait_s, name="guarded")
    live: dict[str, set[int]] = {"raw": set(), "guarded": set()}

    def produce(index: int) -> None:
        r, producer, i = random.Random(seed * 100 + index), make_producer(kafka), 0
        while not stop.is_set():
            values = [f"{index}:{i + j}" for j in range(r.randint(1, 4))]
            for v in values:
                producer.produce(topic, key=b"k", value=v.encode())
            try:
                flush_or_raise(producer, timeout=60)
                acked.extend(values)
            except DeliveryError:
                pass
            i += len(values)
            time.sleep(r.uniform(0, 0.03))

    def consume(name: str) -> None:
        consumer = make_consumer(kafka, None)
        assign_guarded(consumer, gaps, [TopicPartition(topic, 0, 0)])
        try:
            while not stop.is_set():
                msgs = consumer.consume(500, timeout=0.2)
                if name == "guarded":
                    msgs = take_contiguous(consumer, gaps, msgs)
                live[name].update(m.offset() for m in msgs if m.error() is None)
        finally:
            consumer.close()

    def holes() -> int:
        return gaps.holes_filled + gaps.holes_skipped

    threads = [threading.Thread(target=produce, args=(i,), daemon=True) for i in range(producers)]
    threads += [threading.Thread(target=consume, args=(name,), daemon=True) for name in live]
    for t in threads:
        t.start()
    kills: list[str] = []
    try:
        if proxy is not None:
            started = time.monotonic()
            while time.monotonic() - started < duration_s or (holes() < min_holes
                                                              and time.monotonic() - started < 10 * duration_s):
                time.sleep(0.5)
        while proxy is None and (len(kills) < min_kills or (holes() < min_holes and len(kills) < max_kills)):
            time.sleep(rng.uniform(2, 5))
            victim = rng.choice(["tansu", "weed"])
            es.kill(victim)
            down = rng.uniform(0.3, 3.0)
            time.sleep(down)
            es.restart(victim)
            kills.append(f"{victim} ({down:.1f} s)")
        time.sleep(gap_wait_s + 3)  # the guarded consumer waits out a last hole
    finally:
        stop.set()
        for t in threads:
            t.join(120)

    replay = OffsetGaps(gap_wait_s, name="replay")
    try:
        final = {m.offset(): m.value().decode() for m in read_topic(kafka, topic)}
        replayed = {m.offset() for m in read_topic(kafka, topic, gaps=replay)}
    finally:
        if proxy is not None:  # Tansu goes back to the store itself
            es.kill("tansu")
            es.tansu_s3_endpoint = None
            es.restart("tansu")
            proxy.close()
    # the live consumers stopped at some point: only the records before the last one both saw count
    upto = min(max(live["raw"], default=-1), max(live["guarded"], default=-1))
    present = sorted(o for o in final if o <= upto)
    values = set(final.values())
    return ReadReport(acked=len(acked), on_topic=len(final), kills=kills,
                      missed_raw=[o for o in present if o not in live["raw"]],
                      missed_guarded=[o for o in present if o not in live["guarded"]],
                      lost=[v for v in acked if v not in values],
                      holes=sorted(set(range(max(final, default=-1) + 1)) - set(final)),
                      gaps=gaps.stats(), fill_waits=gaps.fill_waits,
                      replay_missed=sorted(set(final) - replayed), replay_gaps=replay.stats(),
                      replay_skip_waits=replay.skip_waits)


def _kind(method: str, path: str) -> str:
    query = path.partition("?")[2]
    if method == "GET" and "list-type=" in query:
        return "list_page" if "continuation-token=" in query else "list"
    return method.lower() if method in ("GET", "PUT", "DELETE", "HEAD") else "other"


class DelayingS3Proxy:
    """Forwards every request to the S3 store at `target` ("host:port") unchanged (the Host header
    too: the signature covers it), holding a PUT back `uniform(0, max_delay_s)` first with
    probability `p`. Serves in threads of this process on 127.0.0.1 (`url`) until `close()`."""

    def __init__(self, target: str, max_delay_s: float = 0.2, p: float = 0.5, seed: int = 0):
        rng, lock = random.Random(seed), threading.Lock()
        host, port = target.rsplit(":", 1)
        self.delayed = 0
        # requests by kind: "list" (a first page), "list_page" (a further page), get, put, delete, other
        self.counts: dict[str, int] = {}

        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the broker's client expects

            def log_message(self, *args) -> None:
                pass

            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                kind = _kind(self.command, self.path)
                with lock:
                    proxy.counts[kind] = proxy.counts.get(kind, 0) + 1
                if self.command == "PUT":
                    with lock:
                        delay = rng.uniform(0, max_delay_s) if rng.random() < p else 0.0
                    if delay:
                        proxy.delayed += 1
                        time.sleep(delay)
                conn = HTTPConnection(host, int(port), timeout=60)
                try:
                    conn.request(self.command, self.path, body=body or None, headers=dict(self.headers.items()))
                    resp = conn.getresponse()
                    data = resp.read()
                finally:
                    conn.close()
                self.send_response_only(resp.status, resp.reason)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "content-length", "connection"):
                        self.send_header(k, v)
                length = resp.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length or str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
