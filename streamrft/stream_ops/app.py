"""The stream-ops faust app: wiring only (validate -> score -> experiences or DLQ, per record).

Run one worker with `streamrft score run.yaml` or `run_worker(cfg, "w0")`. Every worker of a
namespace joins the consumer group `<ns>.stream-ops`, so workers share the rollouts partitions and
a restarted one resumes from committed offsets alone (no tables, nothing else to recover).

At-least-once: the agent iterates a `stream.noack()` stream, so faust never acks a record on its
own; an in-order acker awaits each output's broker acknowledgement (the future `topic.send()`
returns) and only then calls `stream.ack(event)`. faust commits only the contiguous acked prefix
of a partition (`Consumer._new_offset`), so no offset is committed before its output is durable;
a failed send crashes the app instead of acking, and a restarted worker redoes the record.
(faust's own `stream_publish_on_commit` is not used: its commit path waits on the sends with
`wait_many` and `producer.flush()`, neither of which raises for a failed send, so it commits anyway.)

faust 0.15.3 accepts `app.topic(pattern=...)` but never subscribes to it (its conductor indexes
`topic.topics` only; see "XXX pattern does not work" in its aiokafka driver), so the pattern is
matched against cluster metadata here: at start and every `RESCAN_S`; faust applies an added
topic at its next resubscription (up to 45 s later).
"""
from __future__ import annotations

import asyncio
import logging
import re
import ssl
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NamedTuple

import faust
from confluent_kafka import KafkaException

from streamrft.config import KafkaConfig, RunConfig
from streamrft.schemas import DeadLetter, ExperienceGroup, Metric, RolloutGroup, encode, rollouts_pattern, topic_name
from streamrft.stream_ops.scoring import ScoringError, build_scorer
from streamrft.stream_ops.validate import InvalidRollout, team_of_topic, validate

log = logging.getLogger(__name__)

ROLE = "stream_ops"
METRICS_INTERVAL_S = 5.0
RESCAN_S = 10.0
MAX_IN_FLIGHT = 1000
"""Records processed but not yet acknowledged by the broker (backpressure on the stream)."""

Scorer = Callable[[RolloutGroup], ExperienceGroup | None]


class Outcome(NamedTuple):
    """What one input record becomes: `kind` is "experience", "dead_letter" or "filtered"."""

    kind: str
    key: bytes | None
    value: bytes | None
    trajectories: int


def route_record(scorer: Scorer, namespace: str, value: bytes | None, key: bytes | None,
                 topic: str, partition: int, offset: int) -> Outcome:
    """Validate and score one rollouts record (pure): an experience, a dead letter, or filtered."""
    try:
        group = validate(value, expected_team=team_of_topic(topic, namespace))
        exp = scorer(group)
    except (InvalidRollout, ScoringError) as e:
        error_type = e.error_type if isinstance(e, ScoringError) else type(e).__name__
        dead = DeadLetter(reason=str(e), error_type=error_type, source_topic=topic, source_partition=partition,
                          source_offset=offset, role=ROLE, key=key, value=value or b"")
        return Outcome("dead_letter", key, encode(dead), 0)
    if exp is None:
        return Outcome("filtered", None, None, len(group.trajectories))
    exp.source_topic, exp.source_partition, exp.source_offset = topic, partition, offset
    return Outcome("experience", exp.group_id.encode(), encode(exp), len(exp.trajectories))


@dataclass
class Counters:
    """Totals since the worker started, counted when the output is acknowledged."""

    scored: int = 0
    filtered: int = 0
    dead_lettered: int = 0
    trajectories: int = 0

    def add(self, outcome: Outcome) -> None:
        if outcome.kind == "experience":
            self.scored += 1
        elif outcome.kind == "filtered":
            self.filtered += 1
        else:
            self.dead_lettered += 1
        self.trajectories += outcome.trajectories

    @property
    def groups(self) -> int:
        return self.scored + self.filtered + self.dead_lettered


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


def make_app(cfg: RunConfig, worker_id: str) -> faust.App:
    """The faust app of one worker: one agent over every team's rollouts topic, a metrics timer."""
    ns = cfg.namespace
    scorer = build_scorer(cfg)
    datadir = Path(cfg.output_dir) / "stream-ops"  # faust insists on one, even with no tables
    datadir.mkdir(parents=True, exist_ok=True)
    app = faust.App(
        f"{ns}.stream-ops",
        **broker_settings(cfg.kafka),
        # the embedded broker holds each JoinGroup reply for half the session timeout
        broker_session_timeout=cfg.kafka.session_timeout_ms / 1000,
        broker_heartbeat_interval=cfg.kafka.heartbeat_interval_ms / 1000,
        store="memory://", web_enabled=False, autodiscover=False,
        key_serializer="raw", value_serializer="raw",
        topic_disable_leader=True, topic_allow_declare=False,
        consumer_auto_offset_reset="earliest",  # never `latest`: end offsets are wrong on Tansu
        producer_acks=-1, producer_linger=0.005,
        producer_max_batch_size=1 << 20, producer_max_request_size=16 << 20,
        datadir=str(datadir),
    )
    names = matching_topics(cfg.kafka, ns) or [topic_name(ns, "rollouts", cfg.explorer.team)]
    rollouts = app.topic(*names)
    experiences = app.topic(topic_name(ns, "experiences"))
    dlq = app.topic(topic_name(ns, "dlq"))
    metrics = app.topic(topic_name(ns, "metrics"))
    outputs = {"experience": experiences, "dead_letter": dlq}
    counters = Counters()

    @app.agent(rollouts)
    async def score(stream):
        inflight: asyncio.Queue = asyncio.Queue(maxsize=MAX_IN_FLIGHT)
        manual = stream.noack()

        async def ack_in_order() -> None:
            while True:
                delivered, event, outcome = await inflight.get()
                if delivered is not None:
                    try:
                        await delivered  # the broker's acknowledgement (acks=all) of the output
                    except Exception as e:  # the producer already retried; redo from committed offsets
                        await app.crash(e)
                        raise
                await manual.ack(event)
                counters.add(outcome)

        acker = asyncio.ensure_future(ack_in_order())
        try:
            async for event in manual.events():
                m = event.message
                outcome = route_record(scorer, ns, event.value, m.key, m.topic, m.partition, m.offset)
                delivered = None
                if outcome.kind != "filtered":
                    delivered = await outputs[outcome.kind].send(key=outcome.key, value=outcome.value)
                await inflight.put((delivered, event, outcome))
                if acker.done():
                    acker.result()  # re-raise a failed delivery
        finally:
            acker.cancel()

    last = {"t": time.monotonic(), "groups": 0, "trajectories": 0, "step": 0}

    @app.timer(interval=METRICS_INTERVAL_S)
    async def report_metrics() -> None:
        now = time.monotonic()
        dt = max(now - last["t"], 1e-9)
        values = {
            "scored": counters.scored, "filtered": counters.filtered, "dead_lettered": counters.dead_lettered,
            "groups_per_s": (counters.groups - last["groups"]) / dt,
            "trajectories_per_s": (counters.trajectories - last["trajectories"]) / dt,
        }
        last.update(t=now, groups=counters.groups, trajectories=counters.trajectories, step=last["step"] + 1)
        metric = Metric(role=ROLE, role_id=worker_id, step=last["step"], values=values)
        await metrics.send(key=worker_id.encode(), value=encode(metric))

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


def run_worker(cfg: RunConfig, worker_id: str, stop_after: float | None = None, loglevel: str = "warning") -> int:
    """Run one stream-ops worker in this (main) thread until SIGTERM/SIGINT or `stop_after` seconds."""
    from streamrft.infra.kafka import ensure_topics, run_topics

    ensure_topics(cfg.kafka, run_topics(cfg.kafka, cfg.namespace, teams=(cfg.explorer.team,)))
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    app = make_app(cfg, worker_id)
    worker = faust.Worker(app, loop=loop, loglevel=loglevel, quiet=True, redirect_stdouts=False)
    if stop_after is not None:
        loop.call_later(stop_after, lambda: asyncio.ensure_future(worker.stop(), loop=loop))
    try:
        worker.execute_from_commandline()
    except SystemExit as e:  # mode's Worker always exits through sys.exit
        return int(e.code or 0)
    return 0
