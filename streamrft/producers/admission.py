"""Admission control: an explorer does not start a group that would arrive too stale to train.

A group generated with weights v is trainable while the trainer's version T satisfies
T - v <= max_staleness. The trainer consumes `batch_groups * sync_interval` groups per version, so
across all explorers at most `(max_staleness + 1) * batch_groups * sync_interval` groups made with
v can be trained before they turn stale. Each explorer takes the share of that quota that its
slots are of all slots (`membership.py`), so shares follow the explorers actually present, and
waits for a newer version once its share is spent. Pure functions, unit-tested.
"""
from __future__ import annotations

import math


def run_quota(max_staleness: int, batch_groups: int, sync_interval: int) -> int:
    """Groups all explorers together may start with one weight version."""
    return (max_staleness + 1) * batch_groups * sync_interval


def explorer_quota(run_total: int, slots: int, num_slots: int) -> int:
    """One explorer's share of `run_total`: in proportion to the slots it holds, rounded up (at
    least 1 while it holds a slot, so it never stalls on rounding); 0 without a slot."""
    if slots <= 0:
        return 0
    return max(1, math.ceil(run_total * slots / num_slots))


def admit(engine_version: int, latest_version: int, started_with_version: int, max_staleness: int, quota: int) -> bool:
    """May the explorer start one more group now?

    engine_version: weights loaded in the engine; latest_version: newest version announced;
    started_with_version: groups this explorer already started with `engine_version`.
    """
    if latest_version - engine_version > max_staleness:
        return False  # already too stale before generating: swap first
    return started_with_version < quota
