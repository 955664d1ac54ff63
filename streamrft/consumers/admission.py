"""Which delivered trajectories the trainer may train on: never twice, never too stale; which first.

`SeenWindow` remembers the ids already trained on, with their model version; ids older than
`version - max_staleness` can be forgotten because the staleness rule drops them anyway: the
trainer's version never goes down (not even across a restart, see trainer.py), so a copy of a
forgotten id that arrives later is at least as stale as when it was forgotten. The window is
saved inside every checkpoint, so re-delivery after any crash is harmless; the ids of the batch
being assembled (not trained yet, so not in the window) are checked too. Pure, unit-tested.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Hashable


def staleness(trainer_version: int, model_version: int) -> int:
    return trainer_version - model_version


def is_fresh(trainer_version: int, model_version: int, max_staleness: int | None) -> bool:
    """None = no staleness rule (replaying another run's log)."""
    return max_staleness is None or 0 <= staleness(trainer_version, model_version) <= max_staleness


@dataclass
class SeenWindow:
    ids: dict[str, int] = field(default_factory=dict)  # traj_id -> model_version

    def __contains__(self, traj_id: str) -> bool:
        return traj_id in self.ids

    def add(self, traj_id: str, model_version: int) -> None:
        self.ids[traj_id] = model_version

    def prune(self, trainer_version: int, max_staleness: int | None) -> None:
        if max_staleness is None:
            return  # replay: every id stays relevant until the end of the log
        oldest = trainer_version - max_staleness
        self.ids = {k: v for k, v in self.ids.items() if v >= oldest}


@dataclass
class Counts:
    trained: int = 0
    stale: int = 0
    duplicate: int = 0
    dead_lettered: int = 0
    groups_trained: int = 0
    replayed: int = 0  # trajectories trained again from the replay buffer (not in `trained`)
    stale_groups: int = 0  # groups dropped whole because a trajectory of theirs was too stale

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)

    def add(self, other: "Counts") -> None:
        for k, v in other.__dict__.items():
            setattr(self, k, getattr(self, k) + v)


def admit_trajectories(trajs, trainer_version: int, max_staleness: int | None, seen: SeenWindow,
                       counts: Counts, batch_ids: set[str] | None = None) -> list[int]:
    """Indices of `trajs` (one group) to train on now; counts the rest as stale or duplicate.

    A group is trained whole or not at all: if any of its trajectories not trained yet is too
    stale, all of them are dropped as stale (counted in `stale` and, once, `stale_groups`). Its
    advantages were normalised over all of its trajectories; a part of it trained alone would
    carry a baseline made with the others (e.g. only the successes kept, every advantage > 0).
    `batch_ids`: ids already admitted into the batch being assembled; the ids admitted here are
    added to it, so a group delivered twice into one batch is trained once.
    """
    batch_ids = set() if batch_ids is None else batch_ids
    new, ids = [], set()
    for i, t in enumerate(trajs):
        if t.traj_id not in seen and t.traj_id not in batch_ids and t.traj_id not in ids:
            new.append(i)
            ids.add(t.traj_id)
    counts.duplicate += len(trajs) - len(new)
    if any(not is_fresh(trainer_version, trajs[i].model_version, max_staleness) for i in new):
        counts.stale += len(new)
        counts.stale_groups += 1
        return []
    batch_ids.update(ids)
    return new


def oldest_head(partitions: list[Hashable], version_of: Callable[[int], int]) -> int:
    """Index of the fetched record to consume next: of each partition's first one, the one made with
    the oldest weights (`version_of(i)`, -1 for a record that does not decode; ties: fetched first).

    Explorers' admission control bounds staleness in the order groups were generated, and fetches
    interleave partitions in another order; a partition's own records stay in order (positions and
    commits rely on it). `partitions[i]` is record i's partition, in fetch order.
    """
    heads: dict[Hashable, int] = {}
    for i, part in enumerate(partitions):
        heads.setdefault(part, i)
    return min(heads.values(), key=lambda i: (version_of(i), i))
