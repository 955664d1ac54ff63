"""Validation of one rollouts record: bytes in, a `RolloutGroup` out, or `InvalidRollout` with a reason.

The schema (`streamrft.schemas`) already rejects wrong types, token ids < 0, positive log-probs,
length mismatches, trajectories of another group or task and duplicate trajectory ids; this adds
what it cannot see: a team other than the topic's, a non-finite env reward or timestamp. An
empty response (even in every trajectory) is valid: it is a legitimate, if poor, sample.
"""
from __future__ import annotations

import math

from streamrft.schemas import DecodeError, RolloutGroup, decode


class InvalidRollout(ValueError):
    """A rollouts record that cannot be scored. `field` is the dotted path of the first bad field."""

    def __init__(self, field: str, reason: str):
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")


def team_of_topic(topic: str, namespace: str) -> str | None:
    """`"ns.rollouts.blue"` -> `"blue"`; None when the topic is not a rollouts topic of `namespace`."""
    prefix = f"{namespace}.rollouts."
    return topic[len(prefix):] if topic.startswith(prefix) and len(topic) > len(prefix) else None


def validate(raw: bytes | None, expected_team: str | None = None) -> RolloutGroup:
    """Decode and check one record; `expected_team` (the topic's team) must match the group's teams."""
    if raw is None:
        raise InvalidRollout("<bytes>", "no value (tombstone)")
    try:
        group = decode(raw, RolloutGroup)
    except DecodeError as e:
        raise InvalidRollout(e.field, e.problem) from None
    assert isinstance(group, RolloutGroup)
    if expected_team is not None and group.team != expected_team:
        # a team may write only its own topic; a group claiming another team is mislabelled
        raise InvalidRollout("team", f"group says team {group.team!r} but arrived on team {expected_team!r}'s topic")
    if not math.isfinite(group.created_at):
        raise InvalidRollout("created_at", f"not finite: {group.created_at}")
    for i, t in enumerate(group.trajectories):
        if t.task_id != group.task.task_id:  # the schema checks this too; kept as the role's own contract
            raise InvalidRollout(f"trajectories.{i}.task_id",
                                 f"{t.task_id!r} is not the group's task {group.task.task_id!r}")
        if t.team != group.team:
            raise InvalidRollout(f"trajectories.{i}.team", f"{t.team!r} differs from the group's team {group.team!r}")
        if t.env_reward is not None and not math.isfinite(t.env_reward):
            raise InvalidRollout(f"trajectories.{i}.env_reward", f"not finite: {t.env_reward}")
    return group
