"""Data cleaning ops: an ordered list (`stream_ops.ops`) applied to each rollouts group before scoring.

An op is made once per worker by `make(**params)` (a module in this package, listed in `OPS`, or
your own factory at `import_path: "pkg.module:make"`) and is then called as `op(group) -> {index:
reason}`: the trajectories to drop, the group keeps the rest. An op that finds the whole record
unusable raises `RecordRejected(reason)`: the record is dead-lettered (any other exception too).
`scoring.Scorer` (or `Cleaning.wrap(scorer)`) runs the ops, then scores what is left; fewer than 2 trajectories left ->
the group is filtered (like a zero-variance group). Per-op counts go on the worker's Metric.
"""
from __future__ import annotations

import importlib
from typing import Callable

from streamrft.schemas import ExperienceGroup, RolloutGroup
from streamrft.stream_ops.ops import charset, dedup, length, prompt_copy, repetition
from streamrft.stream_ops.errors import RecordRejected, ScoringError

Op = Callable[[RolloutGroup], dict[int, str]]

OPS: dict[str, Callable[..., Op]] = {
    "length": length.make,
    "repetition": repetition.make,
    "charset": charset.make,
    "dedup": dedup.make,
    "prompt_copy": prompt_copy.make,
}


def resolve_op(type_: str | None, import_path: str | None) -> Callable[..., Op]:
    if import_path:
        module, sep, attr = import_path.partition(":")
        if not sep or not module or not attr:
            raise ValueError(f"op import_path {import_path!r} must look like 'pkg.module:make'")
        return getattr(importlib.import_module(module), attr)
    if type_ not in OPS:
        raise ValueError(f"unknown op type {type_!r}; allowed: {', '.join(sorted(OPS))}")
    return OPS[type_]


class Cleaning:
    """The configured ops of one worker, their state (dedup memory) and their counters."""

    def __init__(self, ops: list[tuple[str, Op]]):
        self.ops = ops
        self.counts: dict[str, float] = {}
        for label, _ in ops:
            self.counts[f"op.{label}.dropped"] = 0.0
            self.counts[f"op.{label}.dead_lettered"] = 0.0
        self.counts["op.groups_emptied"] = 0.0

    def clean(self, group: RolloutGroup) -> tuple[RolloutGroup, dict[str, str]]:
        """The group without the trajectories the ops drop, and traj_id -> "op: reason" of those."""
        dropped: dict[str, str] = {}
        for label, op in self.ops:
            if len(group.trajectories) == 0:
                break
            try:
                drops = op(group)
            except RecordRejected as e:
                self.counts[f"op.{label}.dead_lettered"] += 1
                raise RecordRejected(f"op {label!r}: {e.reason}", "RecordRejected") from e
            except Exception as e:  # a user's op can raise anything: this record's dead letter
                self.counts[f"op.{label}.dead_lettered"] += 1
                raise ScoringError(f"op {label!r} raised {type(e).__name__}: {e}", type(e).__name__) from e
            if not drops:
                continue
            self.counts[f"op.{label}.dropped"] += len(drops)
            for i, reason in drops.items():
                dropped[group.trajectories[i].traj_id] = f"{label}: {reason}"
            kept = [t for i, t in enumerate(group.trajectories) if i not in drops]
            # model_construct: the group was validated already, and a group of 0 is not a valid RolloutGroup
            group = RolloutGroup.model_construct(**{**dict(group), "trajectories": kept})
        return group, dropped

    def apply(self, group: RolloutGroup) -> tuple[RolloutGroup | None, dict[str, str]]:
        """`clean`, and None for the group when fewer than 2 trajectories are left (filtered)."""
        group, dropped = self.clean(group)
        if len(group.trajectories) < 2:
            self.counts["op.groups_emptied"] += 1
            return None, dropped
        return group, dropped

    def wrap(self, scorer: Callable[[RolloutGroup], ExperienceGroup | None]):
        """`scorer` behind the ops (synchronous; the worker's `scoring.Scorer` runs them itself)."""
        def cleaned_scorer(group: RolloutGroup) -> ExperienceGroup | None:
            group, dropped = self.apply(group)
            if group is None:
                return None
            exp = scorer(group)
            if exp is not None:
                exp.dropped = dropped
            return exp
        return cleaned_scorer

    def metrics(self) -> dict[str, float]:
        return dict(self.counts)


def build_cleaning(cfg) -> Cleaning:
    """The config's ops, each made once (labels: type or import_path, `#2` on a repeat)."""
    ops: list[tuple[str, Op]] = []
    seen: dict[str, int] = {}
    for i, spec in enumerate(cfg.stream_ops.ops):
        label = spec.type or spec.import_path or ""
        seen[label] = seen.get(label, 0) + 1
        if seen[label] > 1:
            label = f"{label}#{seen[label]}"
        try:
            ops.append((label, resolve_op(spec.type, spec.import_path)(**spec.params)))
        except (TypeError, ValueError) as e:
            raise ValueError(f"stream_ops.ops[{i}] ({label}): {e}") from e
    return Cleaning(ops)


__all__ = ["OPS", "Cleaning", "RecordRejected", "build_cleaning", "resolve_op"]
