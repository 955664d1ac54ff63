"""Offline data from ratings: DPO pairs or KTO labels from a feedback topic and the answers it names.

`streamrft replay --source NS --feedback TEAM CONFIG` (with `algorithm.type: dpo` or `kto`) reads
`NS.feedback.TEAM` (optionally a time range of it) and every `NS.rollouts.*` topic, writes the rows
to `<output_dir>/feedback-<shape>.jsonl` in the shape offline training reads
(`consumers/offline_data.py`), and trains on them.

- An item is a trajectory; a rating names it by its id, its episode's or a gateway completion's
  (`stream_ops.feedback.join.answers_to`). Its text is its task's prompt and its `response_text`.
- `dpo`: each `preference` between two items of one prompt is a row (prompt, chosen, rejected); so
  is each pair of items of one prompt whose mean scalar ratings differ by at least `margin`
  (the best-rated answer of each prompt against its worst, across groups: served users' calls of one
  prompt are groups of their own). Ratings as labels count by the values of the
  config's feedback term (`labels`), when it has one.
- `kto`: each item with scalar ratings or labels is a row, desirable when its mean is at least
  `threshold`; a preference makes its chosen item desirable and its rejected one not, when they
  have no scalar rating.
- Ratings that name no known item are counted (`unknown`), as are the records that do not decode.
"""
from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from streamrft.schemas import Feedback, RolloutGroup, decode


@dataclass
class Item:
    group_id: str
    prompt: str
    text: str


@dataclass
class FeedbackRows:
    rows: list[dict]
    counts: dict[str, int] = field(default_factory=dict)


def feedback_rows(groups: list[RolloutGroup], ratings: list[Feedback], shape: str, labels: dict[str, float] | None = None,
                  threshold: float = 0.5, margin: float = 1e-9) -> FeedbackRows:
    """The `shape` ("dpo" or "kto") rows that `ratings` make of the items of `groups`."""
    from streamrft.stream_ops.feedback.join import answers_to

    if shape not in ("dpo", "kto"):
        raise ValueError(f"feedback rows: shape {shape!r} is not one of ['dpo', 'kto']")
    labels = labels or {}
    items: dict[str, Item] = {}
    owner: dict[str, str] = {}  # any id a rating may name -> its trajectory's id
    for g in groups:
        for t in g.trajectories:
            items[t.traj_id] = Item(g.group_id, g.task.prompt, t.response_text)
            for k in answers_to(t):
                owner.setdefault(k, t.traj_id)
    counts: dict[str, int] = defaultdict(int)
    values: dict[str, list[float]] = defaultdict(list)
    preferences: list[tuple[str, str]] = []
    seen: set[str] = set()
    for f in ratings:
        if f.feedback_id in seen:
            counts["duplicate"] += 1
            continue
        seen.add(f.feedback_id)
        named = [owner.get(i) for i in f.rated()]
        if any(n is None for n in named):
            counts["unknown"] += 1
            continue
        if f.preference is not None:
            preferences.append((named[0], named[1]))
        elif f.reward is not None:
            values[named[0]].append(f.reward)
        elif f.label in labels:
            values[named[0]].append(labels[f.label])
        else:
            counts["unknown_label"] += 1
    mean = {k: sum(v) / len(v) for k, v in values.items()}
    rows: list[dict] = []
    if shape == "dpo":
        pairs = []
        for chosen, rejected in preferences:
            if items[chosen].prompt != items[rejected].prompt:
                counts["pair_across_prompts"] += 1
                continue
            pairs.append((chosen, rejected))
        by_prompt: dict[str, list[str]] = defaultdict(list)
        for k in mean:
            by_prompt[items[k].prompt].append(k)
        for ks in by_prompt.values():
            best, worst = max(ks, key=mean.__getitem__), min(ks, key=mean.__getitem__)
            if mean[best] - mean[worst] >= margin:
                pairs.append((best, worst))
        rows = [{"prompt": items[c].prompt, "chosen": items[c].text, "rejected": items[r].text} for c, r in pairs]
    else:
        desirable = {k: v >= threshold for k, v in mean.items()}
        for chosen, rejected in preferences:
            desirable.setdefault(chosen, True)
            desirable.setdefault(rejected, False)
        rows = [{"prompt": items[k].prompt, "completion": items[k].text, "label": v} for k, v in desirable.items()]
    counts["rows"] = len(rows)
    counts["ratings"] = len(seen)
    return FeedbackRows(rows, dict(counts))


def rollouts_topics(cfg, namespace: str) -> list[str]:
    from streamrft.infra.kafka import make_admin
    from streamrft.schemas import rollouts_pattern

    pattern = re.compile(rollouts_pattern(namespace))
    return sorted(t for t in make_admin(cfg).list_topics(timeout=10).topics if pattern.match(t))


def build_feedback_dataset(cfg, source: str, team: str, path: Path, shape: str, threshold: float = 0.5,
                           from_timestamp_ms: int | None = None, to_timestamp_ms: int | None = None) -> dict[str, int]:
    """Read `source`'s ratings from `team`'s feedback topic (records in [from, to) by their
    timestamps) and its rollouts, write the `shape` rows to `path` as JSONL; returns the counts."""
    from streamrft.infra.kafka import read_topic
    from streamrft.schemas import topic_name

    counts: dict[str, int] = defaultdict(int)

    def decoded(messages, kind):
        for m in messages:
            try:
                yield decode(m.value(), kind)
            except Exception:  # a record that is not one: counted, skipped (stream ops dead-lettered it)
                counts["bad_records"] += 1

    def in_range(m) -> bool:
        ts = m.timestamp()[1]
        return (from_timestamp_ms is None or ts >= from_timestamp_ms) and (to_timestamp_ms is None or ts < to_timestamp_ms)

    ratings = list(decoded([m for m in read_topic(cfg.kafka, topic_name(source, "feedback", team)) if in_range(m)],
                           Feedback))
    groups = [g for t in rollouts_topics(cfg.kafka, source) for g in decoded(read_topic(cfg.kafka, t), RolloutGroup)]
    term = cfg.stream_ops.feedback()
    result = feedback_rows(groups, ratings, shape, dict(term.feedback().labels) if term is not None else None, threshold)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        for row in result.rows:
            fh.write(json.dumps(row) + "\n")
    for k, v in result.counts.items():
        counts[k] += v
    return dict(counts)
