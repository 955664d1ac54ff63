"""The dashboard's picture of a run, fed one decoded record at a time.

`RunState.on_*` take what `reader.py` decodes from the run's topics (in any order across topics:
the reader follows them all from `earliest`). Every chart series is a `Line`, kept whole for the
run (16 bytes a point) and downsampled when sent (`downsample`: min and max per bucket, the first
and last point always kept); `tables()` is the rest of what the page shows; `summary()` both, as
one JSON. The viewer keeps a small row per experience group for the whole run (`GroupRow`) and the
newest groups themselves; older ones are read back from the topic by offset when asked for. The
pure functions below (`consumer_lag`, `staleness_histogram`, `stage_shares`, `team_table`,
`downsample`, ...) hold the arithmetic and are unit-tested with hand values.
"""
from __future__ import annotations

import bisect
import re
import threading
from array import array
from collections import Counter, OrderedDict, deque
from typing import Iterable, NamedTuple

import numpy as np

from streamrft.schemas import DeadLetter, ExperienceGroup, Metric, WeightVersion

LINE_POINTS = 1000  # points a line is downsampled to when sent
GROUPS_MAX = 300  # newest experience groups kept whole for the trajectory viewer
PROMPT_MAX = 500  # characters of a task's prompt kept for the viewer's search
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


def downsample(xs: array, ys: array, n: int = LINE_POINTS, x0: float | None = None,
               x1: float | None = None) -> list[list[float]]:
    """At most `n` points of the line (xs, ys), in their order, as [x, y] pairs; only those with
    x0 <= x <= x1 when a range is given. More than `n`: the first and the last point, and between
    them (n - 2) // 2 buckets of equal count, each giving its lowest and its highest point (a spike
    is never smoothed away)."""
    x = np.frombuffer(xs, dtype=np.float64).copy()  # a copy: an exported array cannot grow
    y = np.frombuffer(ys, dtype=np.float64).copy()
    idx = np.arange(len(x))
    if x0 is not None or x1 is not None:
        keep = np.ones(len(x), dtype=bool)
        if x0 is not None:
            keep &= x >= x0
        if x1 is not None:
            keep &= x <= x1
        idx = idx[keep]
    if len(idx) > max(n, 2):
        inner, buckets = idx[1:-1], max((n - 2) // 2, 1)
        edges = np.linspace(0, len(inner), buckets + 1).astype(int)
        picked = [idx[0]]
        for a, b in zip(edges[:-1], edges[1:]):
            if b > a:
                part = inner[a:b]
                lo, hi = part[np.argmin(y[part])], part[np.argmax(y[part])]
                picked.extend(sorted({int(lo), int(hi)}))
        picked.append(idx[-1])
        idx = np.array(picked)
    return [[_short(x[i]), _short(y[i])] for i in idx]


def _short(v: float) -> float:
    """7 significant digits (a time in epoch seconds keeps its tenths): less JSON, nothing visible lost."""
    return float(f"{v:.10g}") if abs(v) >= 1e6 else float(f"{v:.7g}")


class Line:
    """One chart series, kept whole: appended to, never trimmed."""

    __slots__ = ("chart", "label", "xs", "ys")

    def __init__(self, chart: str, label: str):
        self.chart, self.label = chart, label
        self.xs, self.ys = array("d"), array("d")

    def append(self, x: float, y: float | None) -> None:
        if y is not None:
            self.xs.append(float(x))
            self.ys.append(float(y))

    def __len__(self) -> int:
        return len(self.xs)

    def points(self, start: int = 0, end: int | None = None) -> list[list[float]]:
        end = len(self.xs) if end is None else end
        return [[_short(self.xs[i]), _short(self.ys[i])] for i in range(start, end)]


class GroupRow(NamedTuple):
    """What the viewer filters and pages a group by; the group itself is read back by offset."""
    seq: int  # the order this dashboard read the groups in
    team: str
    task_id: str
    reward_mean: float
    version: int  # the oldest of its trajectories' versions: when the group was generated
    finish: frozenset  # its trajectories' finish reasons
    created_at: float
    topic: str
    partition: int
    offset: int


def role_label(role_id: str, taken: dict[str, str], prefix: str) -> str:
    """A role's name on the page: `explorer-3-12721` -> `explorer 3` (its index in the run); others
    are numbered in the order they appear, `stream ops 0`, `stream ops 1`, ... (`prefix`)."""
    if role_id not in taken:
        m = re.fullmatch(r"explorer-(\d+)-\d+", role_id)
        if m:
            taken[role_id] = f"explorer {m.group(1)}"
        else:
            n = sum(1 for v in taken.values() if v.startswith(prefix + " "))
            taken[role_id] = f"{prefix} {n}"
    return taken[role_id]


def eval_source(role_id: str) -> str:
    """Which eval a point is: the launcher's (a run's start and end), the evaluator's (every k-th
    version), or a gateway's."""
    if role_id == "launcher":
        return "launcher"
    if role_id.startswith("evaluator"):
        return "evaluator"
    return role_id


# the charts, each line's x: time (epoch seconds; the page subtracts t0), version or step
CHARTS = {"reward_time": "time", "reward_version": "version", "trainer": "step", "offpolicy": "step",
          "streamops": "time", "versions": "time", "feedback": "time"}
FEEDBACK_LINES = {"parked": "groups parked", "parked_age_max_s": "oldest parked, s", "joined": "joined",
                  "timed_out": "timed out"}
"""The feedback join's figures charted (a run with a `feedback` term; the chart shows only then)."""
FINAL_KEYS = ("eval_reward_start", "eval_reward_end", "versions", "trajectories", "trained", "stale",
              "stale_pct", "wall_s")


class RunState:
    """Everything the page shows, fed by the reader thread, read by the web handlers (one lock)."""

    def __init__(self, namespace: str):
        self.namespace = namespace
        self.lock = threading.Lock()
        self.revision = 0  # bumped on every change: the live stream looks for news only when it moved
        self.t0: float | None = None  # the oldest record's created_at: the charts' time origin
        self.lines: dict[str, Line] = {}  # "<chart>/<label>" -> its points, in the order read
        self.labels: dict[str, str] = {}  # role id -> its name on the page
        self.trainer_last: dict[str, float] = {}
        self.last_eval: dict | None = None
        self.evals_seen = 0
        self.explorers: dict[str, dict[str, float]] = {}  # by label
        self.announces: list[tuple[float, int]] = []  # sorted (t, version): staleness at a time
        self.stream_ops: dict[str, dict[str, float]] = {}  # by label
        self.scored = deque(maxlen=STALENESS_MAX)  # (scored_at, model_version) per trajectory
        self.team_exp: dict[str, Counter] = {}
        self.gateway: dict[str, dict[str, float]] = {}
        self.dead_reasons: Counter[str] = Counter()
        self.dead_by_team: Counter[str] = Counter()
        self.dead = deque(maxlen=DEAD_MAX)
        self.index: list[GroupRow] = []  # every group read, oldest first
        self.recent: OrderedDict[tuple[str, int, int], ExperienceGroup] = OrderedDict()  # the newest, whole
        self.prompts: dict[str, str] = {}  # task id -> its prompt's start (the viewer's search)
        self.finish_reasons: set[str] = set()
        self.finished: dict | None = None  # the launcher's final record, once the run has ended
        self.tokenizer = False  # the viewer's tokenizer is loaded (the page then asks for text again)
        self.seen: dict[tuple[str, int], int] = {}  # (topic, partition) -> next offset seen
        self.committed: dict[str, dict[tuple[str, int], int]] = {}
        self._tables: tuple[int, dict] | None = None  # (revision, tables()) made last

    @property
    def groups_seen(self) -> int:
        return len(self.index)

    def line(self, chart: str, label: str) -> Line:
        key = f"{chart}/{label}"
        if key not in self.lines:
            self.lines[key] = Line(chart, label)
        return self.lines[key]

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
                self.line("reward_time", "train reward").append(t, v["reward_mean"])
                self.line("reward_version", "train reward").append(v.get("version", m.step), v["reward_mean"])
            for k in TRAINER_TIMINGS:
                if k in v:
                    self.line("trainer", k).append(m.step, v[k])
            if "iw_mean" in v:
                for k in OFF_POLICY:
                    if k in v:
                        self.line("offpolicy", k).append(m.step, v[k])
        elif m.role == "eval" and "eval_reward" in v:
            source, version = eval_source(m.role_id), int(v.get("version", m.step))
            self.line("reward_time", f"eval ({source})").append(t, v["eval_reward"])
            self.line("reward_version", f"eval ({source})").append(version, v["eval_reward"])
            if self.last_eval is None or t >= self.last_eval["t"]:
                self.last_eval = {"t": t, "version": version, "reward": v["eval_reward"], "source": source}
            self.evals_seen += 1
        elif m.role == "run" and m.role_id == "launcher":
            self.finished = {"t": t, **{k: v[k] for k in FINAL_KEYS if k in v}}
        elif m.role == "explorer":
            label = role_label(m.role_id, self.labels, "explorer")
            self.explorers[label] = {**self.explorers.get(label, {}), **v}
            self.line("versions", f"{label} loaded").append(t, v.get("version", m.step))
        elif m.role == "gateway":
            if ":" in m.role_id:  # a team's counters; the gateway's own figures have no team
                self.gateway[m.role_id] = v
        elif m.role == "feedback_join":
            for k, label in FEEDBACK_LINES.items():
                if k in v:
                    self.line("feedback", label).append(t, v[k])
        elif m.role == "stream_ops":
            label = role_label(m.role_id, self.labels, "stream ops")
            self.stream_ops[label] = v
            if "latency_p50_s" in v:
                self.line("streamops", f"{label} p50").append(t, v["latency_p50_s"])

    def on_weights(self, w: WeightVersion) -> None:
        self._time(w.created_at)
        self.line("versions", "published").append(w.created_at, w.version)
        bisect.insort(self.announces, (w.created_at, w.version))

    def on_experience(self, eg: ExperienceGroup, topic: str, partition: int, offset: int) -> None:
        self._time(eg.created_at)
        finish = frozenset(t.finish_reason for t in eg.trajectories)
        self.finish_reasons |= finish
        self.index.append(GroupRow(len(self.index), eg.team, eg.task.task_id, sum(eg.rewards) / len(eg.rewards),
                                   min(t.model_version for t in eg.trajectories), finish, eg.created_at,
                                   topic, partition, offset))
        self.prompts.setdefault(eg.task.task_id, eg.task.prompt[:PROMPT_MAX])
        self.recent[(topic, partition, offset)] = eg
        while len(self.recent) > GROUPS_MAX:
            self.recent.popitem(last=False)
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
        if committed != self.committed:
            self.committed = committed
            self.revision += 1

    # ---- read by the page (callers hold the lock) -----------------------------------------------
    def tables(self) -> dict:
        """All the page shows but the lines (each table sent again when it changed), made once a
        revision however many pages are open. Callers hold the lock and do not modify it."""
        if self._tables is None or self._tables[0] != self.revision:
            self._tables = (self.revision, self._make_tables())
        return self._tables[1]

    def _make_tables(self) -> dict:
        return {
            "namespace": self.namespace, "t0": self.t0, "trainer": self.trainer_last,
            "last_eval": self.last_eval, "evals_seen": self.evals_seen, "finished": self.finished,
            "staleness": staleness_histogram(self.announces, list(self.scored)),
            "explorer_stages": {k: stage_shares(v) for k, v in sorted(self.explorers.items())},
            "stream_ops": dict(sorted(self.stream_ops.items())),
            "lag": consumer_lag(self.seen, self.committed),
            "records": {f"{t}:{p}": n for (t, p), n in sorted(self.seen.items())},
            "dead_reasons": dict(self.dead_reasons.most_common()),
            "dead_letters": list(self.dead)[-50:][::-1],
            "teams": team_table(self.team_exp, self.gateway, self.dead_by_team),
            "groups_seen": self.groups_seen,
            "finish_reasons": sorted(self.finish_reasons),
            "tokenizer": self.tokenizer,
        }

    def summary(self, points: int = LINE_POINTS) -> dict:
        """Every chart's data as one JSON (`GET /api/summary`): the tables, and each line
        downsampled to `points`."""
        with self.lock:
            return {"revision": self.revision, **self.tables(),
                    "lines": {k: {"chart": ln.chart, "x": CHARTS[ln.chart], "label": ln.label,
                                  "n": len(ln), "points": downsample(ln.xs, ln.ys, points)}
                              for k, ln in self.lines.items()}}


def reason_kind(error_type: str, reason: str) -> str:
    """What dead letters are counted by: the error type and the reason up to its first ':' (usually
    the field or stage at fault; the rest names the record's values)."""
    head = reason.split(":", 1)[0].strip()[:120] or "(no reason)"
    return f"{error_type}: {head}" if error_type and error_type != head else head
