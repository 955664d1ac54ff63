"""The feedback join (`streamrft join`): parked groups meet their ratings, then are scored.

With a `feedback` reward term, stream ops validate each rollouts record, park it on `<ns>.parked`
(compacted, keyed by group_id) and ack it (`stream_ops/app.py` `park_record`): a group that waits
minutes for a person must not hold its partition's commit. This role:

- folds `<ns>.parked` and every team's `<ns>.feedback.<team>` from offset 0 on start (no faust
  table: the embedded broker's high watermarks break changelog recovery), reading up to each
  partition's true end (`partition_ends`) before it decides anything, then follows them;
  topics of teams that appear later are picked up within `RESCAN_S`;
- a parked group whose trajectories each have `min_rated` ratings (`join.FeedbackJoin`) is scored
  with every term, the `feedback` term being the ratings' aggregate, exactly as stream ops score
  (`route_group`): an experience, or filtered, or a dead letter, with its `GroupDropped` and
  `TaskOutcome` records; then a tombstone on `<ns>.parked` (same key, same partition) closes it;
- a group still short after `wait_s`: `on_timeout` `drop` (a `GroupDropped`, reason
  `feedback_timeout`), `dead_letter` (the group to the DLQ, with its rollouts record's place) or
  `fallback` (scored with `fallback_term`'s values in the feedback term's place);
- a rating that does not decode is a dead letter with its topic and offset; copies, late ratings,
  unknown ids and labels, and ratings from a team not allowed are counted, never applied.

Outputs are acknowledged before the tombstone is sent, so a crash in between scores the group again
on restart: at least once, like every stream op; the trainer drops trajectory ids it has trained,
explorers count a group_id once. Admission counts a parked group as generated until it is trained or
dropped, so parked groups hold their place in the staleness bound (docs/feedback.md).
"""
from __future__ import annotations

import logging
import re
import threading
import time
from collections import Counter

from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from streamrft.config import RunConfig
from streamrft.schemas import DeadLetter, Feedback, GroupDropped, Metric, ParkedGroup, decode, encode, topic_name
from streamrft.stream_ops.feedback.join import FeedbackJoin, FeedbackPolicy, Outcome

log = logging.getLogger(__name__)

ROLE = "feedback_join"
RESCAN_S = 10.0
DUE_EVERY_S = 0.5
METRICS_INTERVAL_S = 5.0
MAX_RATERS = 50
"""Raters whose agreement is reported (by name), at most."""


def feedback_pattern(namespace: str) -> str:
    return "^" + re.escape(namespace) + r"\.feedback\..+"


def policy_of(cfg: RunConfig) -> FeedbackPolicy:
    term = cfg.stream_ops.feedback()
    if term is None:
        raise ValueError("the feedback join needs a `feedback` term in stream_ops.rewards")
    p = term.feedback()
    return FeedbackPolicy(min_rated=p.min_rated, aggregate=p.aggregate, wait_s=p.wait_s, labels=dict(p.labels),
                          teams=None if p.teams is None else tuple(p.teams))


class FeedbackJoiner:
    def __init__(self, cfg: RunConfig, stop: threading.Event | None = None, role_id: str = "join-0"):
        from streamrft.infra.kafka import make_consumer, make_producer
        from streamrft.stream_ops.scoring import build_scorer

        self.cfg, self.ns, self.role_id = cfg, cfg.namespace, role_id
        self.stop = stop or threading.Event()
        self.params = cfg.stream_ops.feedback().feedback()
        self.join = FeedbackJoin(policy_of(cfg))
        self.scorer = build_scorer(cfg, with_rewards=True)
        self.parked_topic = topic_name(self.ns, "parked")
        self.consumer = make_consumer(cfg.kafka, f"{self.ns}.feedback-join")  # assigned, never committed
        self.producer = make_producer(cfg.kafka)
        self.assigned: set[tuple[str, int]] = set()
        self.place: dict[str, tuple[int, ParkedGroup]] = {}  # group_id -> (its parked partition, the record)
        self.counts: Counter = Counter()  # outputs: experience, filtered, dead_letter, dropped
        self.by_source: Counter = Counter()  # ratings applied by source (human, user, verifier, model)
        self.step = 0

    # -- reading -----------------------------------------------------------------------------

    def _topics(self) -> list[str]:
        from streamrft.infra.kafka import make_admin

        pattern = re.compile(feedback_pattern(self.ns))
        found = make_admin(self.cfg.kafka).list_topics(timeout=10).topics
        return [self.parked_topic, *sorted(t for t in found if pattern.match(t))]

    def _assign_new(self) -> list[str]:
        """Assign, from offset 0, the partitions of topics not read yet; returns the new topics."""
        new_topics, fresh = [], []
        meta = self.consumer.list_topics(timeout=10).topics
        for t in self._topics():
            if t not in meta or meta[t].error is not None:
                continue
            parts = [(t, p) for p in sorted(meta[t].partitions) if (t, p) not in self.assigned]
            if parts:
                new_topics.append(t)
                fresh += [TopicPartition(t, p, OFFSET_BEGINNING) for t, p in parts]
                self.assigned.update(parts)
        if fresh:
            self.consumer.incremental_assign(fresh)
        return new_topics

    def catch_up(self, topics: list[str]) -> None:
        """Read `topics` to their true ends (as they were when this began) before deciding anything:
        a restarted join must see a group's tombstone before it could score the group again."""
        from streamrft.infra.kafka import consume_ready, partition_ends

        ends = {(e.topic, e.partition): e.end for t in topics for e in partition_ends(self.cfg.kafka, t, idle_s=0.5)}
        reached: dict[tuple[str, int], int] = {}
        deadline = time.monotonic() + 120.0
        while any(reached.get(k, 0) < end for k, end in ends.items()) and time.monotonic() < deadline:
            if self.stop.is_set():
                return
            for m in consume_ready(self.consumer, 1000, 0.2):
                self._handle(m)
                if m.error() is None:
                    reached[(m.topic(), m.partition())] = m.offset() + 1
        missing = {k: (reached.get(k, 0), end) for k, end in ends.items() if reached.get(k, 0) < end}
        if missing:
            log.warning("feedback join: caught up without reaching %s (read, end)", missing)

    def _handle(self, m) -> None:
        if m.error() is not None:
            if m.error().fatal():
                from confluent_kafka import KafkaException

                raise KafkaException(m.error())
            log.warning("feedback join: consume error: %s", m.error())
            return
        now = time.time()
        topic = m.topic()
        try:
            if topic == self.parked_topic:
                group_id = (m.key() or b"").decode("utf-8", "replace")
                if m.value() is None:  # a tombstone: the group was settled (before a restart)
                    self._forget(group_id)
                    return
                parked = decode(m.value(), ParkedGroup)
                gid = parked.group.group_id
                if gid not in self.join.parked and gid not in self.join.settled:  # else a copy: counted
                    self.place[gid] = (m.partition(), parked)
                self.join.park(parked.group, parked.parked_at)
            else:
                rating = decode(m.value(), Feedback)
                self.join.rate(rating, now, topic[len(f"{self.ns}.feedback."):])
        except Exception as e:  # any record: a dead letter with its place, the role goes on
            self._dead_letter(f"{type(e).__name__}: {e}", type(e).__name__, m.value(), m.key(), topic,
                              m.partition(), m.offset())

    def _forget(self, group_id: str) -> None:
        """A tombstone read back: the group is settled (its outcome was durable before it was written)."""
        timed_out = group_id in self.join.parked and self.join.rewards(self.join.parked[group_id]) is None
        if group_id in self.join.parked:
            self.join.settle(group_id, timed_out)
        else:
            self.join.settled.add(group_id)
        self.place.pop(group_id, None)

    # -- deciding ------------------------------------------------------------------------------

    def settle_due(self, now: float) -> int:
        """Score or time out every group that is due; returns how many were settled."""
        from streamrft.infra.kafka import flush_or_raise

        due = self.join.due(now)
        for outcome in due:
            self._emit(outcome)
        if due:
            flush_or_raise(self.producer)  # every output durable before any tombstone
            for outcome in due:
                gid = outcome.group.group_id
                partition, _ = self.place.pop(gid)
                self.producer.produce(self.parked_topic, value=None, key=gid.encode(), partition=partition)
                self.join.settle(gid, timed_out=outcome.rewards is None)
            flush_or_raise(self.producer)
        self.join.expire(now)
        return len(due)

    def _emit(self, outcome: Outcome) -> None:
        from streamrft.stream_ops.app import dead_letter, route_group

        group = outcome.group
        _, parked = self.place[group.group_id]
        where = (parked.source_topic, parked.source_partition, parked.source_offset)
        if outcome.rewards is not None:
            rewards = {t.traj_id: r for t, r in zip(group.trajectories, outcome.rewards)}
            out = route_group(lambda g: self.scorer(g, rewards), group, *where)
        elif self.params.on_timeout == "fallback":
            out = route_group(lambda g: self.scorer(g, self.params.fallback_term), group, *where)
            self.counts["fallback"] += 1
        elif self.params.on_timeout == "dead_letter":
            out = dead_letter(f"no feedback within wait_s={self.params.wait_s:g} s: each trajectory needs "
                              f"{self.params.min_rated} rating(s)", "FeedbackTimeout", encode(group),
                              group.group_id.encode(), *where)
        else:  # drop
            drop = GroupDropped(group_id=group.group_id, reason="feedback_timeout", role=ROLE)
            self.producer.produce(topic_name(self.ns, "admission"), key=drop.group_id.encode(), value=encode(drop))
            self.counts["dropped"] += 1
            return
        if outcome.rewards is not None:
            for f in {f.feedback_id: f for keys in self.join.parked[group.group_id].keys
                      for f in self.join._of(keys, group.team)}.values():
                self.by_source[f.source] += 1
        self.counts[out.kind] += 1
        if out.kind == "experience":
            self.producer.produce(topic_name(self.ns, "experiences"), key=out.key, value=out.value)
        elif out.kind == "dead_letter":
            self.producer.produce(topic_name(self.ns, "dlq"), key=out.key, value=out.value)
        if out.dropped is not None:
            self.producer.produce(topic_name(self.ns, "admission"), key=out.dropped[0], value=out.dropped[1])
        if out.stats is not None:
            self.producer.produce(topic_name(self.ns, "task-stats"), key=out.stats[0], value=out.stats[1])

    def _dead_letter(self, reason: str, error_type: str, value, key, topic: str, partition: int, offset: int) -> None:
        dead = DeadLetter(reason=reason[:4000], error_type=error_type[:256], source_topic=topic,
                          source_partition=partition, source_offset=offset, role=ROLE, key=(key or b"")[:1 << 20],
                          value=(value or b"")[:1 << 20])
        self.producer.produce(topic_name(self.ns, "dlq"), key=key, value=encode(dead))
        self.counts["bad_records"] += 1

    # -- reporting -----------------------------------------------------------------------------

    def metrics(self, now: float) -> dict[str, float]:
        """Parked groups and the oldest one's age, what was joined, timed out and why, the odd
        ratings counted, ratings applied by source, and per rater (`rater_gap_<rater>`) the mean
        distance of their rating from the other raters' mean on the items they shared."""
        ages = [now - p.parked_at for p in self.join.parked.values()]
        c = self.join.counters
        settled = c["joined"] + c["timed_out"]
        return {"parked": float(len(ages)), "parked_age_max_s": max(ages, default=0.0),
                "joined": float(c["joined"]), "timed_out": float(c["timed_out"]),
                "timed_out_share": c["timed_out"] / settled if settled else 0.0, "parked_twice": float(c["parked_twice"]),
                **{f"ratings_{k}": float(c[k]) for k in ("ratings", "duplicate", "late", "unknown", "unknown_label",
                                                           "wrong_team")},
                **{f"ratings_from_{k}": float(v) for k, v in self.by_source.items()},
                **{f"rater_gap_{r}": total / n for r, (n, total) in sorted(self.join.agreement.items())[:MAX_RATERS]},
                **{f"out_{k}": float(v) for k, v in self.counts.items()}}

    def _report(self, now: float) -> None:
        self.step += 1
        metric = Metric.of_finite(ROLE, self.role_id, self.step, self.metrics(now))
        self.producer.produce(topic_name(self.ns, "metrics"), key=self.role_id.encode(), value=encode(metric))

    # -- the loop ------------------------------------------------------------------------------

    def run(self) -> int:
        from streamrft.infra.kafka import consume_ready, flush_or_raise

        try:
            self.catch_up(self._assign_new())
            last_due = last_scan = last_report = 0.0
            while not self.stop.is_set():
                for m in consume_ready(self.consumer, 1000, 0.2):
                    self._handle(m)
                mono = time.monotonic()
                if mono - last_due >= DUE_EVERY_S:
                    last_due = mono
                    self.settle_due(time.time())
                if mono - last_scan >= RESCAN_S:
                    last_scan = mono
                    new = self._assign_new()
                    if new:
                        log.info("feedback join: reading %s", new)
                if mono - last_report >= METRICS_INTERVAL_S:
                    last_report = mono
                    self._report(time.time())
                self.producer.serve()
            self._report(time.time())
            flush_or_raise(self.producer, 10.0)
            return 0
        finally:
            self.consumer.close()
            self.producer.close()


def run_joiner(cfg: RunConfig, stop: threading.Event | None = None) -> int:
    """Run the feedback join until `stop` (or SIGTERM / SIGINT in the main thread)."""
    import signal

    from streamrft.infra.kafka import ensure_topics, run_topics

    ensure_topics(cfg.kafka, run_topics(cfg.kafka, cfg.namespace, teams=cfg.teams))
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    return FeedbackJoiner(cfg, stop).run()
