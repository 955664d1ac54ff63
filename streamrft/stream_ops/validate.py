"""Validation of one rollouts record: bytes in, a `RolloutGroup` out, or `InvalidRollout` with a reason.

The schema (`streamrft.schemas`, strict: its JSON Schema is the wire contract) rejects wrong types,
out-of-range numbers, non-finite floats, length mismatches and trajectories of another group, task
or team; this adds what the bytes alone cannot tell: a group on another team's topic. An empty
response (even in every trajectory) is valid: it is a legitimate, if poor, sample.
"""
from __future__ import annotations

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
    """Decode and check one record; `expected_team` (the topic's team) must be the group's team.

    Every rejection is an `InvalidRollout`, even a decoder bug: bad bytes must become a dead letter,
    never an exception that stops the stream.
    """
    if raw is None:
        raise InvalidRollout("<bytes>", "no value (tombstone)")
    try:
        group = decode(raw, RolloutGroup)
    except DecodeError as e:
        raise InvalidRollout(e.field, e.problem) from None
    except Exception as e:  # not a verdict on the record but a fault of ours: still a dead letter, with its type
        raise InvalidRollout("<bytes>", f"decoder failed: {type(e).__name__}: {e}") from e
    assert isinstance(group, RolloutGroup)
    if expected_team is not None and group.team != expected_team:
        # a team may write only its own topic; a group claiming another team is mislabelled
        raise InvalidRollout("team", f"group says team {group.team!r} but arrived on team {expected_team!r}'s topic")
    return group
