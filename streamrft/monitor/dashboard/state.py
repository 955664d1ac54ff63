"""The dashboard's picture of a run: bounded in-memory state fed one decoded record at a time.

`RunState.on_*` take what `reader.py` decodes from the run's topics (in any order across topics:
the reader follows them all from `earliest`); `summary()` is the JSON the page draws. The pure
functions below (`consumer_lag`, `staleness_histogram`, `stage_shares`, `team_table`, ...) hold the
arithmetic and are unit-tested with hand values. Nothing grows without bound: series and recent
records are deques, counters are per name.
"""
from __future__ import annotations

import bisect
import threading
from collections import Counter, deque
from typing import Iterable

from streamrft.schemas import DeadLetter, ExperienceGroup, Metric, WeightVersion

SERIES_MAX = 5000  # points per chart series
GROUPS_MAX = 300  # recent experience groups kept for the trajectory viewer
DEAD_MAX = 200  # recent dead letters kept for the viewer
STALENESS_MAX = 20000  # recent (scored_at, model_version) pairs the histogram is made of
TRAINER_TIMINGS = ("wait_s", "step_s", "publish_s", "loop_latency_s")
# how off-policy each batch was (`engine/algorithms/offpolicy.py`)
OFF_POLICY = ("iw_mean", "iw_max", "iw_ess", "clip_frac_pos", "clip_frac_neg", "neg_iw_over_c", "clip_frac_turn0",
              "staleness_mean", "turns_3p", "staleness_turns_3p")


def consumer_lag(seen: dict[tuple[str, int], int], committed: dict[str, dict[tuple[str, int], int]]
                 ) -> dict[str, dict[str, int]]:
    """group -> topic -> records behind: per partition, the next offset this reader has seen (it reads
    every topic from the start, so that is the true end as far as it knows) minus the group's
    committed offset, never below 0. A topic counts for a group once the group committed on any of
    its partitions; there, a partition with records but no commit lags by all it holds."""
    out: dict[str, dict[str, int]] = {}
    for group, offsets in committed.items():
        topics = {t for t, _ in offsets}
        for (topic, partition), end in seen.items():
            if topic in topics:
                behind = max(end - offsets.get((topic, partition), 0), 0)
                out.setdefault(group, {}).setdefault(topic, 0)
                out[group][topic] += behind
    return out


def version_at(announces: list[tuple[float, int]], t: float) -> int | None:
    """The newest version announced at or before time `t`; `announces` sorted by time."""
    i = bisect.bisect_right(announces, (t, float("inf")))
    return max((v for _, v in announces[:i]), default=None) if i else None


def staleness_histogram(announces: list[tuple[float, int]], scored: Iterable[tuple[float, int]]) -> dict[int, int]:
    """staleness -> trajectories, staleness counted when stream ops scored the trajectory: the
    newest version announced by then minus the version that generated it (a lower bound of the
    trainer's own count, which also includes the time in the experiences topic)."""
    times, newest, top = [], [], 0
    for t, v in announces:  # the newest version announced by each announce's time (a prefix max)
        top = max(top, v)
        times.append(t)
        newest.append(top)
    hist: Counter[int] = Counter()
    for t, model_version in scored:
        i = bisect.bisect_right(times, t)
        hist[max((newest[i - 1] if i else 0) - model_version, 0)] += 1
    return dict(sorted(hist.items()))


def stage_shares(values: dict[str, float]) -> dict[str, float]:
    """An explorer's stage timings (cumulative seconds, `<stage>_s`) as shares of its `wall_s`.
    Rates (`*_per_s`) are not stages."""
    wall = values.get("wall_s", 0.0)
    if wall <= 0:
        return {}
    return {k.removesuffix("_s"): v / wall for k, v in values.items()
            if k.endswith("_s") and not k.endswith("_per_s") and k != "wall_s"}


def team_of_topic(topic: str, namespace: str) -> str | None:
    """`<ns>.rollouts.<team>` -> team; None for other topics."""
    prefix = f"{namespace}.rollouts."
    return topic[len(prefix):] if topic.startswith(prefix) else None


def team_table(experiences: dict[str, Counter], gateway: dict[str, dict[str, float]],
               dead_by_team: dict[str, int]) -> dict[str, dict[str, float]]:
    """team -> counters: what reached the experiences topic (groups, trajectories, trained and
    masked tokens, reward sum -> mean), the gateway's newest counters summed over gateways
    (`<gateway id>:<team>` ids: episodes, tokens, 429 rejections) and the team's dead letters."""
    out: dict[str, dict[str, float]] = {}
    for team, c in experiences.items():
        row = out.setdefault(team, {})
        row.update(groups=c["groups"], trajectories=c["trajectories"], trained_tokens=c["trained_tokens"],
                   masked_tokens=c["masked_tokens"],
                   reward_mean=c["reward_sum"] / c["trajectories"] if c["trajectories"] else 0.0)
    for who, values in gateway.items():
        team = who.rsplit(":", 1)[1]
        row = out.setdefault(team, {})
        for key, name in (("episodes_finished", "episodes"), ("prompt_tokens", "prompt_tokens"),
                          ("completion_tokens", "completion_tokens"), ("rejected_admission", "rejected"),
                          ("rejected_stale", "rejected"), ("episodes_expired", "expired")):
            row[name] = row.get(name, 0.0) + values.get(key, 0.0)
    for team, n in dead_by_team.items():
        out.setdefault(team, {})["dead_letters"] = n
    return dict(sorted(out.items()))


class RunState:
    """Everything the page shows, fed by the reader thread, read by the web handlers (one lock)."""

    def __init__(self, namespace: str):
        self.namespace = namespace
        self.lock = threading.Lock()
        self.revision = 0  # bumped on every change: the live stream sends only when it moved
        self.t0: float | None = None  # the oldest record's created_at: the charts' time origin
        self.train = deque(maxlen=SERIES_MAX)  # (t, step, version, reward_mean, staleness_mean)
        self.evals = deque(maxlen=SERIES_MAX)  # (t, version, eval_reward)
        self.trainer_timings = deque(maxlen=SERIES_MAX)  # (t, step, wait, step, publish, loop latency)
        self.off_policy = deque(maxlen=SERIES_MAX)  # (t, step, *OFF_POLICY)
        self.trainer_last: dict[str, float] = {}
        self.explorers: dict[str, dict[str, float]] = {}
        self.loaded: dict[str, deque] = {}  # explorer id -> (t, version its engine had)
        self.published = deque(maxlen=SERIES_MAX)  # (t, version) from the weights topic
        self.announces: list[tuple[float, int]] = []  # sorted (t, version): staleness at a time
        self.stream_ops: dict[str, dict[str, float]] = {}
        self.stream_latency: dict[str, deque] = {}  # worker -> (t, p50, max)
        self.scored = deque(maxlen=STALENESS_MAX)  # (scored_at, model_version) per trajectory
        self.team_exp: dict[str, Counter] = {}
        self.gateway: dict[str, dict[str, float]] = {}
        self.dead_reasons: Counter[str] = Counter()
        self.dead_by_team: Counter[str] = Counter()
        self.dead = deque(maxlen=DEAD_MAX)
        self.groups = deque(maxlen=GROUPS_MAX)  # (ExperienceGroup, topic, partition, offset)
        self.groups_seen = 0
        self.seen: dict[tuple[str, int], int] = {}  # (topic, partition) -> next offset seen
        self.committed: dict[str, dict[tuple[str, int], int]] = {}

    # ---- fed by the reader (each under the lock) ----------------------------------------------
    def _time(self, t: float) -> None:
        self.t0 = t if self.t0 is None else min(self.t0, t)
        self.revision += 1

    def on_offset(self, topic: str, partition: int, offset: int) -> None:
        key = (topic, partition)
        self.seen[key] = max(self.seen.get(key, 0), offset + 1)

    def on_metric(self, m: Metric) -> None:
        self._time(m.created_at)
        v, t = m.values, m.created_at
        if m.role == "trainer":
            self.trainer_last = {**v, "step": m.step}
            if "reward_mean" in v:
                self.train.append((t, m.step, v.get("version", 0.0), v["reward_mean"], v.get("staleness_mean")))
            self.trainer_timings.append((t, m.step, *(v.get(k) for k in TRAINER_TIMINGS)))
            if "iw_mean" in v:
                self.off_policy.append((t, m.step, *(v.get(k) for k in OFF_POLICY)))
        elif m.role == "eval" and "eval_reward" in v:
            self.evals.append((t, int(v.get("version", m.step)), v["eval_reward"]))
        elif m.role == "explorer":
            self.explorers[m.role_id] = {**self.explorers.get(m.role_id, {}), **v}
            self.loaded.setdefault(m.role_id, deque(maxlen=SERIES_MAX)).append((t, int(v.get("version", m.step))))
        elif m.role == "gateway":
            if ":" in m.role_id:  # a team's counters; the gateway's own figures have no team
                self.gateway[m.role_id] = v
        else:  # stream ops workers
            self.stream_ops[m.role_id] = v
            if "latency_p50_s" in v:
                self.stream_latency.setdefault(m.role_id, deque(maxlen=SERIES_MAX)).append(
                    (t, v["latency_p50_s"], v.get("latency_max_s")))

    def on_weights(self, w: WeightVersion) -> None:
        self._time(w.created_at)
        self.published.append((w.created_at, w.version))
        bisect.insort(self.announces, (w.created_at, w.version))

    def on_experience(self, eg: ExperienceGroup, topic: str, partition: int, offset: int) -> None:
        self._time(eg.created_at)
        self.groups.append((eg, topic, partition, offset))
        self.groups_seen += 1
        c = self.team_exp.setdefault(eg.team, Counter())
        c["groups"] += 1
        for traj, reward in zip(eg.trajectories, eg.rewards):
            self.scored.append((eg.created_at, traj.model_version))
            mask = traj.mask()
            c["trajectories"] += 1
            c["trained_tokens"] += sum(mask)
            c["masked_tokens"] += len(mask) - sum(mask)
            c["reward_sum"] += reward

    def on_dead_letter(self, d: DeadLetter, offset: int) -> None:
        self._time(d.created_at)
        self.dead_reasons[reason_kind(d.error_type, d.reason)] += 1
        team = team_of_topic(d.source_topic, self.namespace)
        if team is not None:
            self.dead_by_team[team] += 1
        self.dead.append({"t": d.created_at, "reason": d.reason, "error_type": d.error_type, "role": d.role,
                          "source_topic": d.source_topic, "source_partition": d.source_partition,
                          "source_offset": d.source_offset, "bytes": len(d.value), "dlq_offset": offset})

    def on_committed(self, committed: dict[str, dict[tuple[str, int], int]]) -> None:
        self.committed = committed
        self.revision += 1

    # ---- read by the page -------------------------------------------------------------------------
    def summary(self) -> dict:
        """Every chart's data, as plain JSON (times are epoch seconds; the page subtracts `t0`)."""
        with self.lock:
            staleness = staleness_histogram(self.announces, list(self.scored))
            return {
                "namespace": self.namespace, "revision": self.revision, "t0": self.t0,
                "train": list(self.train), "evals": list(self.evals),
                "trainer_timings": {"names": list(TRAINER_TIMINGS), "points": list(self.trainer_timings)},
                "off_policy": {"names": list(OFF_POLICY), "points": list(self.off_policy)},
                "trainer": self.trainer_last,
                "staleness": staleness,
                "published": list(self.published),
                "loaded": {k: list(v) for k, v in sorted(self.loaded.items())},
                "explorer_stages": {k: stage_shares(v) for k, v in sorted(self.explorers.items())},
                "stream_ops": {k: {**v, "latency": list(self.stream_latency.get(k, ()))}
                               for k, v in sorted(self.stream_ops.items())},
                "lag": consumer_lag(self.seen, self.committed),
                "records": {f"{t}:{p}": n for (t, p), n in sorted(self.seen.items())},
                "dead_reasons": dict(self.dead_reasons.most_common()),
                "dead_letters": list(self.dead)[-50:][::-1],
                "teams": team_table(self.team_exp, self.gateway, self.dead_by_team),
                "groups_seen": self.groups_seen,
            }


def reason_kind(error_type: str, reason: str) -> str:
    """What dead letters are counted by: the error type and the reason up to its first ':' (usually
    the field or stage at fault; the rest names the record's values)."""
    head = reason.split(":", 1)[0].strip()[:120] or "(no reason)"
    return f"{error_type}: {head}" if error_type and error_type != head else head
