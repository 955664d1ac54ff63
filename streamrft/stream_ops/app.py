"""The stream-ops faust app: wiring only (validate -> score -> experiences or DLQ, per record; every
scored group's per-episode rewards -> `<ns>.task-stats` for the explorers' task selection).

Run one worker with `streamrft score run.yaml` or `run_worker(cfg, "w0")`. Every worker of a
namespace joins the consumer group `<ns>.stream-ops`, so workers share the rollouts partitions and
a restarted one resumes from committed offsets alone (no tables, nothing else to recover).

No record can stop the worker: `route_record` turns any exception raised while handling one record
(decode, validate, a user's reward, encoding the output) into a dead letter, and the agent never
raises. Were it to raise, faust would restart it and drop the acks of the records in flight, so
their partitions would never commit again; a failure that is not the record's (a send the
producer gave up on) instead crashes the whole worker, which exits non-zero: with `OUTAGE_EXIT` when
the broker did not answer (`is_broker_outage`), and then `streamrft score` replaces it with a fresh
worker in the same role process (`infra/supervise.py`), which redoes what was not committed.

Each record is scored and sent by its own task, so records score concurrently (up to
`MAX_IN_FLIGHT`) and a slow model judge holds up no other record: its own term's timeout and
retries bound it (`stream_ops/slow_terms.py`). Outputs may therefore leave out of input order.
At-least-once: the agent iterates a `stream.noack()` stream, so faust never acks a record on its
own; an in-order acker awaits each record's task, then its outputs' broker acknowledgement (the future
`topic.send()` returns) and only then calls `stream.ack(event)`. faust commits only the contiguous acked prefix
of a partition (`Consumer._new_offset`), so no offset is committed before its output is durable;
a failed send crashes the app instead of acking, and a restarted worker redoes the record.
(faust's own `stream_publish_on_commit` is not used: its commit path waits on the sends with
`wait_many` and `producer.flush()`, neither of which raises for a failed send, so it commits anyway.)
Shutdown is bounded: `STOP_GRACE_S` after a stop begins (SIGTERM, or a crash) the process exits
even if faust is still waiting on a broker that is gone; what it had not committed is redone.

faust 0.15.3 accepts `app.topic(pattern=...)` but never subscribes to it (its conductor indexes
`topic.topics` only; see "XXX pattern does not work" in its aiokafka driver), so the pattern is
matched against cluster metadata here: at start and every `RESCAN_S`; faust applies an added
topic at its next resubscription (up to 45 s later).
"""
from __future__ import annotations

import asyncio
import logging
import os
import re
import ssl
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Awaitable, Callable, NamedTuple

import faust
from faust.types import TP
from confluent_kafka import KafkaException

from streamrft.config import KafkaConfig, RunConfig
from streamrft.infra.supervise import OUTAGE_EXIT
from streamrft.infra.offset_gaps import REWIND_PAUSE_S, OffsetGaps
from streamrft.schemas import (DeadLetter, ExperienceGroup, GroupDropped, Metric, ParkedGroup, RolloutGroup,
                               TaskOutcome, encode, rollouts_pattern, topic_name)
from streamrft.stream_ops.scoring import Scored, ScoringError, build_scorer
from streamrft.stream_ops.validate import InvalidRollout, team_of_topic, validate

log = logging.getLogger(__name__)

ROLE = "stream_ops"
METRICS_INTERVAL_S = 5.0
RESCAN_S = 10.0
MAX_IN_FLIGHT = 1000
"""Records processed but not yet acknowledged by the broker (backpressure on the stream)."""
MAX_REQUEST_BYTES = 16 << 20
"""faust's `producer_max_request_size`; brokers must accept records this large (docker-compose sets
`message.max.bytes` to it). An experience that would not fit is dead-lettered instead."""
RECORD_OVERHEAD_BYTES = 4096
"""Room left in a request for the record batch framing, timestamp and headers."""
DEAD_LETTER_MAX_BYTES = 1 << 20
"""A dead letter embeds at most this many bytes of the original value, and of its key, so that it can
always be produced, whatever the poison record's size; its reason then says so with the original
size. Nothing is lost: the whole record stays on its source topic at `source_offset`."""
REASON_MAX_CHARS = 4000
PRODUCER_REQUEST_TIMEOUT_S = 30.0
"""How long the producer retries an output before its send fails and the worker exits non-zero
(faust's default is 20 minutes). faust's env var PRODUCER_REQUEST_TIMEOUT overrides it."""
STOP_GRACE_S = 10.0
"""After a stop begins, the process exits within this long, even while faust waits on a dead broker."""

_OUTAGE_ERRORS = ("KafkaTimeoutError", "UnknownError", "KafkaConnectionError", "NodeNotReadyError",
                  "RequestTimedOutError", "NoBrokersAvailable")


def is_broker_outage(exc: BaseException | None) -> bool:
    """Did the worker fail because the broker did not answer (down, restarting, unreachable), not
    because of what it sent or who it is (a record too large, a refused authorization)? Tansu
    answers a produce with UnknownError while its own store is away."""
    from aiokafka.errors import KafkaError

    if isinstance(exc, KafkaError):
        return bool(getattr(exc, "retriable", False)) or type(exc).__name__ in _OUTAGE_ERRORS
    return isinstance(exc, (ConnectionError, TimeoutError, asyncio.TimeoutError))


Scorer = Callable[[RolloutGroup], "ExperienceGroup | None | Scored"]
AsyncScorer = Callable[[RolloutGroup], Awaitable["ExperienceGroup | None | Scored"]]


class Outcome(NamedTuple):
    """What one input record becomes: `kind` is "experience", "dead_letter", "filtered" or "parked"
    (a valid group waiting on `<ns>.parked` for its ratings: `key`/`value` its `ParkedGroup`).

    `key`/`value` go to the experiences topic or the DLQ (none when filtered); a group that will
    never be trained (filtered or dead-lettered) also yields `dropped`, the (key, value) of its
    `GroupDropped` record on the admission topic, which explorers' admission control counts. A
    scored group, filtered or not, also yields `stats`, the (key, value) of its `TaskOutcome` on the
    task-stats topic (when the scorer returns a `Scored`), which explorers' task selection reads.
    """

    kind: str
    key: bytes | None
    value: bytes | None
    trajectories: int
    dropped: tuple[bytes, bytes] | None = None
    stats: tuple[bytes, bytes] | None = None


class OutputTooLarge(ValueError):
    """The experience of a valid group is larger than one produce request may be."""


def route_record(scorer: Scorer, namespace: str, value: bytes | None, key: bytes | None,
                 topic: str, partition: int, offset: int, max_output_bytes: int = MAX_REQUEST_BYTES) -> Outcome:
    """Validate and score one rollouts record (pure): an experience, a dead letter, or filtered.

    Never raises an `Exception`: whatever goes wrong with this one record makes it a dead letter.
    """
    stage = "validating"
    try:
        group = validate(value, expected_team=team_of_topic(topic, namespace))
        stage = "scoring"
        exp = scorer(group)
        stage = "encoding the experience"
        return _scored(group, exp, topic, partition, offset, max_output_bytes)
    except Exception as e:  # any failure is this record's alone: dead-letter it, never stop the stream
        return _failed(e, stage, value, key, topic, partition, offset)


async def route_record_async(scorer: AsyncScorer, namespace: str, value: bytes | None, key: bytes | None,
                             topic: str, partition: int, offset: int,
                             max_output_bytes: int = MAX_REQUEST_BYTES) -> Outcome:
    """`route_record` with an async scorer (`Scorer.ascore`: slow terms awaited, blocking ones in threads)."""
    stage = "validating"
    try:
        group = validate(value, expected_team=team_of_topic(topic, namespace))
        stage = "scoring"
        exp = await scorer(group)
        stage = "encoding the experience"
        return _scored(group, exp, topic, partition, offset, max_output_bytes)
    except Exception as e:  # any failure is this record's alone: dead-letter it, never stop the stream
        return _failed(e, stage, value, key, topic, partition, offset)


async def park_record(scorer, namespace: str, value: bytes | None, key: bytes | None, topic: str, partition: int,
                      offset: int, max_output_bytes: int = MAX_REQUEST_BYTES) -> Outcome:
    """A rollouts record of a run with a `feedback` term: validated (its pictures checked), then
    parked for the feedback join (`stream_ops/feedback/joiner.py`), which scores it once its ratings
    are in. Never raises an `Exception`: a bad record is a dead letter, as in `route_record`."""
    stage = "validating"
    try:
        group = validate(value, expected_team=team_of_topic(topic, namespace))
        if scorer.images is not None and (group.task.images or any(t.images for t in group.trajectories)):
            await asyncio.to_thread(scorer.images, group)
        stage = "parking"
        parked = ParkedGroup(group=group, parked_at=time.time(), source_topic=topic, source_partition=partition,
                             source_offset=offset)
        out_key, out_value = group.group_id.encode(), encode(parked)
        if len(out_key) + len(out_value) > max_output_bytes - RECORD_OVERHEAD_BYTES:
            raise OutputTooLarge(f"the parked group is {len(out_key) + len(out_value)} bytes; one record may be at "
                                 f"most {max_output_bytes - RECORD_OVERHEAD_BYTES}")
        return Outcome("parked", out_key, out_value, len(group.trajectories))
    except Exception as e:  # any failure is this record's alone
        return _failed(e, stage, value, key, topic, partition, offset)


def route_group(score: Scorer, group: RolloutGroup, topic: str, partition: int, offset: int,
                max_output_bytes: int = MAX_REQUEST_BYTES) -> Outcome:
    """Score a group that was valid when it came (the feedback join's parked groups) as
    `route_record` does: `topic`/`partition`/`offset` are its rollouts record's. Never raises an
    `Exception`: a failure makes the group (re-encoded) a dead letter."""
    try:
        return _scored(group, score(group), topic, partition, offset, max_output_bytes)
    except Exception as e:  # a reward, an advantage, an output too large: this group's alone
        return _failed(e, "scoring", encode(group), group.group_id.encode(), topic, partition, offset)


def _scored(group: RolloutGroup, result: "ExperienceGroup | None | Scored", topic: str, partition: int, offset: int,
            max_output_bytes: int) -> Outcome:
    exp, stats = result, None
    if isinstance(result, Scored):
        exp = result.experience
        outcome = TaskOutcome(group_id=group.group_id, task_id=group.task.task_id, team=group.team,
                              rewards=result.episode_rewards,
                              model_version=max(t.model_version for t in group.trajectories))
        stats = (outcome.group_id.encode(), encode(outcome))
    if exp is None:
        drop = GroupDropped(group_id=group.group_id, reason="filtered", role=ROLE)
        return Outcome("filtered", None, None, len(group.trajectories), (drop.group_id.encode(), encode(drop)),
                       stats)
    exp.source_topic, exp.source_partition, exp.source_offset = topic, partition, offset
    out_key, out_value = exp.group_id.encode(), encode(exp)
    size = len(out_key) + len(out_value)
    if size > max_output_bytes - RECORD_OVERHEAD_BYTES:
        raise OutputTooLarge(f"the experience is {size} bytes; one record may be at most "
                             f"{max_output_bytes - RECORD_OVERHEAD_BYTES}")
    return Outcome("experience", out_key, out_value, len(exp.trajectories), None, stats)


def _failed(e: Exception, stage: str, value: bytes | None, key: bytes | None, topic: str, partition: int,
            offset: int) -> Outcome:
    if isinstance(e, InvalidRollout):
        reason, error_type = _text(e), type(e).__name__
    elif isinstance(e, ScoringError):
        reason, error_type = _text(e), e.error_type
    else:  # not a known kind of bad input: a gap in validation or a bug, worth a traceback
        log.warning("stream-ops: %s while %s %s[%d]@%d; dead-lettered", type(e).__name__, stage,
                    topic, partition, offset, exc_info=True)
        reason, error_type = f"{type(e).__name__} while {stage}: {_text(e)}", type(e).__name__
    return dead_letter(reason, error_type, value, key, topic, partition, offset)


def _text(e: BaseException) -> str:
    """`str(e)` that cannot fail, is valid UTF-8 (msgpack refuses lone surrogates) and is bounded."""
    try:
        text = str(e)
    except Exception:  # a user's exception class with a broken __str__
        text = f"<unprintable {type(e).__name__}>"
    if len(text) > REASON_MAX_CHARS:
        text = f"{text[:REASON_MAX_CHARS]}... [{len(text)} chars]"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def dead_letter(reason: str, error_type: str, value: bytes | None, key: bytes | None,
                topic: str, partition: int, offset: int) -> Outcome:
    """The DLQ record of one input, its key and value cut to `DEAD_LETTER_MAX_BYTES` so it always fits."""
    value = value or b""
    notes = [f"{name} truncated to {DEAD_LETTER_MAX_BYTES} of {len(raw)} bytes"
             for name, raw in (("value", value), ("key", key or b"")) if len(raw) > DEAD_LETTER_MAX_BYTES]
    if notes:
        reason += f" [{'; '.join(notes)}; the whole record is at {topic}[{partition}]@{offset}]"
    key = key[:DEAD_LETTER_MAX_BYTES] if key is not None else None
    error_type = error_type[:256]  # DeadLetter.error_type's bound (a user's exception class names it)
    dead = DeadLetter(reason=reason, error_type=error_type, source_topic=topic, source_partition=partition,
                      source_offset=offset, role=ROLE, key=key, value=value[:DEAD_LETTER_MAX_BYTES])
    drop = GroupDropped.of_record(key, topic, partition, offset, "dead_letter", ROLE)
    return Outcome("dead_letter", key, encode(dead), 0, (drop.group_id.encode(), encode(drop)))


@dataclass
class Counters:
    """Totals since the worker started, counted when the output is acknowledged."""

    scored: int = 0
    filtered: int = 0
    dead_lettered: int = 0
    parked: int = 0
    trajectories: int = 0

    def add(self, outcome: Outcome) -> None:
        if outcome.kind == "experience":
            self.scored += 1
        elif outcome.kind == "filtered":
            self.filtered += 1
        elif outcome.kind == "parked":
            self.parked += 1
        else:
            self.dead_lettered += 1
        self.trajectories += outcome.trajectories

    @property
    def groups(self) -> int:
        return self.scored + self.filtered + self.dead_lettered + self.parked


def broker_settings(cfg: KafkaConfig) -> dict:
    """faust's broker URLs and credentials from the shared Kafka config."""
    urls = [f"kafka://{h.strip()}" for h in cfg.bootstrap.split(",") if h.strip()]
    creds = None
    if cfg.sasl_mechanism:
        ctx = ssl.create_default_context() if cfg.security_protocol == "SASL_SSL" else None
        creds = faust.SASLCredentials(username=cfg.username, password=cfg.password, mechanism=cfg.sasl_mechanism,
                                      ssl_context=ctx)
    elif cfg.security_protocol == "SSL":
        creds = faust.SSLCredentials(ssl.create_default_context())
    return {"broker": urls, "broker_credentials": creds}


def matching_topics(cfg: KafkaConfig, namespace: str) -> list[str]:
    """Every existing topic that matches the namespace's rollouts pattern."""
    from streamrft.infra.kafka import make_admin

    pattern = re.compile(rollouts_pattern(namespace))
    return sorted(t for t in make_admin(cfg).list_topics(timeout=10).topics if pattern.match(t))


class StreamOpsApp(faust.App):
    """faust's App with two fixes and one setting faust does not expose.

    The first fix: a record fetched before a rebalance is never acked unprocessed. faust's stream skips
    records fetched in an older consumer generation (it will fetch them again from the committed
    offset) but still acks them, so their offsets join the acked set and the next commit can move
    past records that no agent has processed yet: a crash then loses them. The consumer here
    refuses exactly those acks (untracked, older generation); records the agent processed are
    tracked and acked as before.

    The second fix: a record past a hole in a partition's offsets is not handed on (`_contiguous`,
    `infra.offset_gaps`): the embedded broker lists a later batch before an earlier one when its S3
    writes finish out of order (a loaded or restarting store), and faust counts the offsets it
    jumped as acked, so the next commit passes records no agent has seen.

    The setting: faust creates its aiokafka consumer with `fetch_max_wait_ms=1500`, and the embedded
    broker holds a fetch that finds nothing new for all of it, so a rollout waited up to 1.5 s to
    be read (in -> out p50 0.4-0.55 s in the CPU demo). Set `fetch_wait_ms` (`kafka.fetch_wait_ms`)
    before the app starts: the consumer is made with it.
    """

    fetch_wait_ms: int | None = None
    gap_wait_s: float = 10.0
    offset_gaps: OffsetGaps | None = None  # made with the consumer

    def _new_consumer(self):
        consumer = super()._new_consumer()
        thread = getattr(consumer, "_thread", None)
        if self.fetch_wait_ms is not None and hasattr(thread, "_create_worker_consumer"):
            create = thread._create_worker_consumer

            def with_fetch_wait(transport):
                kafka_consumer = create(transport)
                # read by aiokafka's start(), which makes the fetcher with it (aiokafka 0.14)
                kafka_consumer._fetch_max_wait_ms = self.fetch_wait_ms
                return kafka_consumer

            thread._create_worker_consumer = with_fetch_wait
        ack = consumer.ack

        def ack_unless_skipped_stale(message) -> bool:
            if not message.tracked and message.generation_id != self.consumer_generation_id:
                return False
            return ack(message)

        consumer.ack = ack_unless_skipped_stale
        consumer.getmany = self._contiguous(consumer, consumer.getmany)
        return consumer

    def _contiguous(self, consumer, getmany):
        """faust's `getmany` behind `OffsetGaps`: a record past a hole is not handed on (faust would
        count the hole's offsets as acked and commit past them); the partition is sought back to the
        hole until its records arrive or `gap_wait_s` passes. Each consumer generation starts every
        partition at its committed offset (faust seeks there on assignment)."""
        gaps = self.offset_gaps = OffsetGaps(self.gap_wait_s, name="stream-ops")
        started: dict[TP, int] = {}  # partition -> the consumer generation its expectation is from

        async def contiguous_getmany(timeout: float):
            rewound: set[TP] = set()
            async for tp, message in getmany(timeout=timeout):
                if tp in rewound:
                    continue
                if started.get(tp) != message.generation_id:
                    started[tp] = message.generation_id
                    gaps.expect(tp, consumer._committed_offset.get(tp))
                back = gaps.rewind(tp, message.offset, message.timestamp)
                if back is None:
                    yield tp, message
                    continue
                rewound.add(tp)
                try:
                    await consumer.seek_wait({tp: back})
                except Exception as e:  # revoked meanwhile: the next generation starts it again
                    log.warning("stream-ops: could not seek %s back to %d: %s", tp, back, e)
                    started.pop(tp, None)
                await asyncio.sleep(REWIND_PAUSE_S)

        return contiguous_getmany


def make_app(cfg: RunConfig, worker_id: str, observe: Callable[[Metric], None] | None = None) -> faust.App:
    """The faust app of one worker: one agent over every team's rollouts topic, a metrics timer
    (each Metric also handed to `observe`: the worker's Prometheus endpoint)."""
    ns = cfg.namespace
    scorer = build_scorer(cfg, with_rewards=True)  # with stream_ops.ops run before scoring
    datadir = Path(cfg.output_dir) / "stream-ops"  # faust insists on one, even with no tables
    datadir.mkdir(parents=True, exist_ok=True)
    app = StreamOpsApp(
        f"{ns}.stream-ops",
        **broker_settings(cfg.kafka),
        # the embedded broker holds each JoinGroup reply for half the session timeout
        broker_session_timeout=cfg.kafka.session_timeout_ms / 1000,
        broker_heartbeat_interval=cfg.kafka.heartbeat_interval_ms / 1000,
        store="memory://", web_enabled=False, autodiscover=False,
        key_serializer="raw", value_serializer="raw",
        topic_disable_leader=True, topic_allow_declare=False,
        consumer_auto_offset_reset="earliest",  # never `latest`: end offsets are wrong on Tansu
        producer_acks=-1, producer_linger=0.005, producer_request_timeout=PRODUCER_REQUEST_TIMEOUT_S,
        producer_max_batch_size=1 << 20, producer_max_request_size=MAX_REQUEST_BYTES,
        datadir=str(datadir),
    )
    app.fetch_wait_ms = cfg.kafka.fetch_wait_ms
    app.gap_wait_s = cfg.kafka.gap_wait_s
    names = matching_topics(cfg.kafka, ns) or [topic_name(ns, "rollouts", cfg.explorer.team)]
    rollouts = app.topic(*names)
    experiences = app.topic(topic_name(ns, "experiences"))
    dlq = app.topic(topic_name(ns, "dlq"))
    metrics = app.topic(topic_name(ns, "metrics"))
    admission = app.topic(topic_name(ns, "admission"))
    task_stats = app.topic(topic_name(ns, "task-stats"))
    outputs = {"experience": experiences, "dead_letter": dlq, "parked": app.topic(topic_name(ns, "parked"))}
    counters = Counters()
    latencies: list[float] = []  # of the records acknowledged since the last metrics report
    busy = {"score_s": 0.0}  # record-seconds spent validating, scoring and computing advantages

    crashed: list[BaseException] = []

    async def crash(exc: BaseException) -> None:
        # the whole worker, never just the agent (see the module docstring); it exits non-zero
        if crashed:
            return
        crashed.append(exc)
        app.crash_cause = exc
        log.error("stream-ops: %s: %s; exiting, a restart redoes the uncommitted records", type(exc).__name__, exc)
        await app.crash(exc)

    @app.agent(rollouts)
    async def score(stream):
        # each record is scored and sent by a task of its own, so a slow judge holds up no other
        # record; the queue bounds the records in flight and the acker acks them in input order
        inflight: asyncio.Queue = asyncio.Queue(maxsize=MAX_IN_FLIGHT)
        pending: set[asyncio.Task] = set()
        manual = stream.noack()

        async def handle(event) -> tuple[list, Outcome]:
            m = event.message
            t0 = time.monotonic()
            if scorer.parks:  # a feedback term: the join scores the group once its ratings are in
                outcome = await park_record(scorer, ns, event.value, m.key, m.topic, m.partition, m.offset)
            else:
                outcome = await route_record_async(scorer.ascore, ns, event.value, m.key, m.topic, m.partition,
                                                   m.offset)
            busy["score_s"] += time.monotonic() - t0
            delivered = []
            if outcome.kind != "filtered":
                delivered.append(await outputs[outcome.kind].send(key=outcome.key, value=outcome.value))
            if outcome.dropped is not None:  # durable before the input is acked: a lost one would
                # hold one group of admission headroom forever
                delivered.append(await admission.send(key=outcome.dropped[0], value=outcome.dropped[1]))
            if outcome.stats is not None:  # durable before the input is acked too: every explorer's
                # task selection counts each scored group once, restarts included
                delivered.append(await task_stats.send(key=outcome.stats[0], value=outcome.stats[1]))
            return delivered, outcome

        def finished(task: asyncio.Task) -> None:
            pending.discard(task)
            # a send the producer refused outright (sizes are checked: not the record): crash now,
            # not when the acker reaches this record behind a slow one
            if not task.cancelled() and task.exception() is not None:
                asyncio.ensure_future(crash(task.exception()))

        async def ack_in_order() -> None:
            try:
                while True:
                    task, event = await inflight.get()
                    delivered, outcome = await task
                    for future in delivered:
                        await future  # the broker's acknowledgement (acks=all) of each output
                    await manual.ack(event)
                    counters.add(outcome)
                    # in -> out: from the producer's timestamp of the record to its outputs acknowledged
                    latencies.append(time.time() - event.message.timestamp)
            except Exception as e:  # a failed delivery (the producer already retried): ack nothing more
                await crash(e)

        acker = asyncio.ensure_future(ack_in_order())
        try:
            async for event in manual.events():
                task = asyncio.ensure_future(handle(event))
                pending.add(task)
                task.add_done_callback(finished)
                await inflight.put((task, event))
                if acker.done() or crashed:  # a delivery failed and the worker is going down: take nothing more
                    return
        except Exception as e:
            await crash(e)
        finally:
            acker.cancel()
            for task in list(pending):
                task.cancel()

    last = {"t": time.monotonic(), "groups": 0, "trajectories": 0, "step": 0}

    async def report_metrics() -> None:
        now = time.monotonic()
        dt = max(now - last["t"], 1e-9)
        values = {
            "scored": counters.scored, "filtered": counters.filtered, "dead_lettered": counters.dead_lettered,
            **({"parked": counters.parked} if scorer.parks else {}),
            "groups_per_s": (counters.groups - last["groups"]) / dt,
            "trajectories_per_s": (counters.trajectories - last["trajectories"]) / dt,
        }
        if latencies:  # the stage's own latency: record in -> outputs acknowledged
            ordered = sorted(latencies)
            values.update(latency_p50_s=ordered[len(ordered) // 2], latency_max_s=ordered[-1])
            latencies.clear()
        values["score_s"] = busy["score_s"]  # summed over records scoring at once: may exceed wall time
        values["reward_fallbacks"] = scorer.stats["fallbacks"]
        if app.offset_gaps is not None:
            values.update(app.offset_gaps.stats())
        if scorer.cleaning is not None:
            values.update(scorer.cleaning.metrics())  # counted when processed (a redone record counts again)
        last.update(t=now, groups=counters.groups, trajectories=counters.trajectories, step=last["step"] + 1)
        metric = Metric(role=ROLE, role_id=worker_id, step=last["step"], values=values)
        if observe is not None:
            observe(metric)
        await metrics.send(key=worker_id.encode(), value=encode(metric))

    app.timer(interval=METRICS_INTERVAL_S)(report_metrics)
    app.final_report = report_metrics  # also once as the worker stops: a run shorter than the interval counts too

    @app.timer(interval=RESCAN_S)
    async def rescan_topics() -> None:
        try:
            found = await asyncio.to_thread(matching_topics, cfg.kafka, ns)
        except KafkaException as e:  # a broker restart: keep the current subscription, look again later
            log.warning("stream-ops: listing topics failed: %s", e)
            return
        current = tuple(rollouts.topics)
        new = tuple(t for t in found if t not in current)
        if new:
            log.info("stream-ops: new rollouts topics %s", new)
            # the agent reads a clone of `rollouts`; discard + add makes the conductor resubscribe
            clones = [c for c in app.topics if tuple(getattr(c, "topics", ())) == current]
            for channel in {rollouts, *clones}:
                channel.topics = current + new
            for channel in clones:
                app.topics.discard(channel)
                app.topics.add(channel)

    return app


class BoundedStopWorker(faust.Worker):
    """faust's Worker, except that once a stop begins the process ends within `STOP_GRACE_S`.

    faust's own stop waits on the producer's flush and the consumer's last commit, each for up to a
    request timeout when the broker is gone. Exiting without them loses nothing: what was not
    committed is redone by the next worker.
    """

    _watchdog: threading.Timer | None = None

    async def stop(self) -> None:
        if self._watchdog is None:
            self._watchdog = threading.Timer(STOP_GRACE_S, self._exit_now)
            self._watchdog.daemon = True
            self._watchdog.start()
            report = getattr(self.app, "final_report", None)
            if report is not None and self.crash_reason is None:
                try:  # the counters since the last report, sent before the producer flushes and stops
                    await asyncio.wait_for(report(), timeout=5.0)
                except Exception as e:  # a broker already gone: the stop goes on
                    log.warning("stream-ops: the final metrics report failed: %s", e)
        await super().stop()

    def disarm(self) -> None:
        """The stop finished in time: the caller keeps its process."""
        if self._watchdog is not None:
            self._watchdog.cancel()

    def exit_code(self, code: int) -> int:
        """`code`, except after a crash because the broker did not answer: `OUTAGE_EXIT`."""
        if code and is_broker_outage(getattr(self.app, "crash_cause", None) or self.crash_reason):
            return OUTAGE_EXIT
        return code

    def _exit_now(self) -> None:
        code = self.exit_code(1 if self.crash_reason is not None else 0)
        log.error("stream-ops: stopping took over %.0f s; exiting with %d (uncommitted records are redone)",
                  STOP_GRACE_S, code)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # a closed pipe must not keep the process alive
                pass
        os._exit(code)


def run_worker(cfg: RunConfig, worker_id: str, stop_after: float | None = None, loglevel: str = "warning") -> int:
    """Run one stream-ops worker in this (main) thread until SIGTERM/SIGINT or `stop_after` seconds.

    Returns 0 after a clean stop and non-zero after a crash (an output the broker never acknowledged).
    A stop that outlasts `STOP_GRACE_S` ends the whole process with `os._exit`.
    """
    from streamrft.infra.kafka import ensure_topics, run_topics
    from streamrft.monitor.prometheus import role_metrics

    ensure_topics(cfg.kafka, run_topics(cfg.kafka, cfg.namespace, teams=cfg.teams))
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    prom = role_metrics(cfg.monitor.prometheus, "stream_ops")
    app = make_app(cfg, worker_id, prom.observe)
    worker = BoundedStopWorker(app, loop=loop, loglevel=loglevel, quiet=True, redirect_stdouts=False)
    if stop_after is not None:
        loop.call_later(stop_after, lambda: asyncio.ensure_future(worker.stop(), loop=loop))
    try:
        worker.execute_from_commandline()
    except SystemExit as e:  # mode's Worker always exits through sys.exit
        return worker.exit_code(int(e.code or 0))
    finally:
        worker.disarm()
        prom.close()
    return 0
