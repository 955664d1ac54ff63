"""The labelling queue of `GET /label`: the answers of parked groups, handed to people to rate.

With a `feedback` reward term, stream ops park every group on `<ns>.parked` until its ratings are
in (docs/feedback.md). `ParkedFollower` folds that topic from offset 0 (a tombstone: the group was
settled) into a `LabelQueue`, which the page asks for work:

- `next(rater, team, now)`: the oldest waiting answer this rater has not rated, that fewer than
  `overlap` raters have rated or hold: an answer handed to one rater is leased to them for
  `lease_s`, so two raters are never shown the same answer at once unless `overlap` > 1 (to
  measure agreement). The same rater asking again gets the answer it holds. A team's raters see
  the groups the feedback term lets it rate (its own team's, or all with `teams`).
- `next_pair(rater, team, now)`: two answers of one group, for an A/B preference, leased alike.
- `rated(rater, traj_id)`: the page's rating went out (`POST /v1/feedback`); the answer is done
  once `overlap` raters have rated it, and leaves the queue when its group is settled.
- `counts()`: answers waiting (not done), held by a rater now, and rated through the page.
"""
from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from streamrft.schemas import ParkedGroup, decode, topic_name

log = logging.getLogger(__name__)


@dataclass
class Answer:
    traj_id: str
    group_id: str
    team: str
    prompt: str
    text: str
    parked_at: float
    leases: dict[str, float] = field(default_factory=dict)  # rater -> lease end
    raters: set[str] = field(default_factory=set)  # who rated it


class LabelQueue:
    def __init__(self, overlap: int = 1, lease_s: float = 300.0, may_rate=None):
        """`may_rate(rater_team, group_team)`: whose groups a team's raters are shown (the feedback
        term's `teams`); None: every group."""
        self.overlap, self.lease_s = overlap, lease_s
        self.may_rate = may_rate or (lambda rater_team, group_team: True)
        self.answers: OrderedDict[str, Answer] = OrderedDict()  # traj_id -> answer, oldest parked first
        self.settled: set[str] = set()  # group ids
        self.lock = threading.Lock()
        self.rated_total = 0

    def park(self, parked: ParkedGroup) -> None:
        g = parked.group
        with self.lock:
            if g.group_id in self.settled:
                return
            for t in g.trajectories:
                if t.traj_id not in self.answers:
                    self.answers[t.traj_id] = Answer(t.traj_id, g.group_id, g.team, g.task.prompt, t.response_text,
                                                     parked.parked_at)
            self.answers = OrderedDict(sorted(self.answers.items(), key=lambda kv: kv[1].parked_at))

    def settle(self, group_id: str) -> None:
        with self.lock:
            self.settled.add(group_id)
            for k in [k for k, a in self.answers.items() if a.group_id == group_id]:
                del self.answers[k]

    def _open(self, a: Answer, rater: str, now: float) -> bool:
        held = {r for r, until in a.leases.items() if until > now and r != rater}
        return rater not in a.raters and len(a.raters | held) < self.overlap

    def next(self, rater: str, team: str, now: float) -> Answer | None:
        """The answer `rater` (of `team`) should rate now (leased to them), or None."""
        with self.lock:
            for a in self.answers.values():  # the one it holds already, first
                if a.leases.get(rater, 0.0) > now and rater not in a.raters:
                    return a
            for a in self.answers.values():
                if self.may_rate(team, a.team) and self._open(a, rater, now):
                    a.leases[rater] = now + self.lease_s
                    return a
        return None

    def next_pair(self, rater: str, team: str, now: float) -> tuple[Answer, Answer] | None:
        """Two answers of one group for `rater` to compare (A/B), both leased to them, or None."""
        with self.lock:
            held = [a for a in self.answers.values() if a.leases.get(rater, 0.0) > now and rater not in a.raters]
            for a in held:  # a pair it holds already
                twin = next((b for b in held if b is not a and b.group_id == a.group_id), None)
                if twin is not None:
                    return a, twin
            by_group: dict[str, list[Answer]] = {}
            for a in self.answers.values():
                if self.may_rate(team, a.team) and self._open(a, rater, now):
                    by_group.setdefault(a.group_id, []).append(a)
                    if len(by_group[a.group_id]) == 2:
                        for b in by_group[a.group_id]:
                            b.leases[rater] = now + self.lease_s
                        return by_group[a.group_id][0], by_group[a.group_id][1]
        return None

    def rated(self, rater: str, traj_id: str) -> None:
        with self.lock:
            a = self.answers.get(traj_id)
            if a is not None and rater not in a.raters:
                a.raters.add(rater)
                a.leases.pop(rater, None)
                self.rated_total += 1

    def counts(self, now: float) -> dict[str, int]:
        with self.lock:
            waiting = sum(len(a.raters) < self.overlap for a in self.answers.values())
            held = sum(any(until > now for until in a.leases.values()) for a in self.answers.values())
            return {"waiting": waiting, "held": held, "rated": self.rated_total}


class ParkedFollower:
    """Folds `<ns>.parked` into a `LabelQueue`, from offset 0, in a thread of its own."""

    def __init__(self, cfg, queue: LabelQueue):
        self.cfg, self.queue = cfg, queue
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, name="label-queue", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(10)

    def _run(self) -> None:
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        from streamrft.infra.kafka import make_consumer

        topic = topic_name(self.cfg.namespace, "parked")
        consumer = make_consumer(self.cfg.kafka, None)
        try:
            meta = consumer.list_topics(topic, timeout=10).topics[topic]
            consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(meta.partitions)])
            while not self.stop_event.is_set():
                for m in consumer.consume(500, timeout=0.2):
                    if m.error() is not None:
                        continue
                    if m.value() is None:  # a tombstone: settled
                        self.queue.settle((m.key() or b"").decode("utf-8", "replace"))
                        continue
                    try:
                        self.queue.park(decode(m.value(), ParkedGroup))
                    except Exception as e:  # the join dead-letters it; the page shows it no answer
                        log.warning("label queue: %s[%d]@%d is no parked group: %s", topic, m.partition(),
                                    m.offset(), e)
        except Exception:
            log.exception("label queue: following %s failed; the page shows nothing new", topic)
        finally:
            consumer.close()
