"""Admission control: explorers generate nothing that would reach the trainer too stale (AReaL's rule).

The trainer trains G = batch_groups x sync_interval groups per weight version, in about the order
they were generated. A group made with weights v is trained at the latest at version v + S
(S = max_staleness) if fewer than (v + S + 1) x G trainable groups were generated before it. So
all explorers together may have generated at most `(v + S + 1) x G + dropped` groups, where
`dropped` counts the generated groups that take no place in the trainer's order: filtered by stream
ops (zero variance), dead-lettered, or dropped stale. The headroom left under that bound is shared
by the explorers present in proportion to their slots (`membership.py`); with none left an explorer
waits, so a slow trainer makes explorers wait, and a slow explorer makes the trainer wait while the
others take the headroom it leaves. v is the explorer's loaded version (from the weights topic);
the trainer announces nothing more than its versions and its dropped groups.

Groups reach the trainer in the order they are finished, not started: while another explorer still
generates with older weights v' < v, the bound is v''s (its groups will be overtaken by those
started now), and the trainer takes the oldest weights first among what it fetched
(`consumers/trainer.py`). What this cannot see is a backlog in transit: after a stream-ops restart
its partitions catch up unevenly, newer groups can overtake older ones and those turn stale.

The counts are global and durable on `<ns>.admission` (`admission_log.py`): every explorer process
publishes its ledger (groups produced and acknowledged, groups being generated now) and stream ops
and the trainer publish one record per dropped group, so a restarted or newly joined explorer reads
the same totals. The topic also orders the decisions: an explorer reserves its share of the
headroom it sees, then keeps only what the records before its reservation leave room for, so two
explorers deciding at the same moment never both take the last group of headroom.

Why it cannot deadlock: an explorer whose weights are older than the trainer's version T waits
only until its watcher has loaded T, and a batch in flight with older weights lowers the bound only
until it is published (or its lease lapses: the explorer died). One with T that waits sees
generated - dropped >= (T + S + 1) x G, while the trainer has trained or batched T x G + q groups
(q < G in its current version); so at least (S + 1) x G - q >= G - q groups are still on their way
to it (or dropped, and about to be published as such). Each of them is either trained (enough of
them make version T + 1, which moves the bound up by G) or dropped (the bound moves up by 1): the
bound moves before the trainer runs dry.

Pure functions and `AdmissionView` (the fold of the topic's records), unit-tested; the I/O is in
`admission_log.py`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from streamrft.producers.once import OnceWindow
from streamrft.schemas import ExplorerLedger, GroupDropped

LEASE_S = 20.0
"""A ledger's `in_flight` counts this long after its last record: a process killed mid-batch
stops holding headroom after that (a live one republishes its ledger every `REFRESH_S`)."""
REFRESH_S = 2.0


def groups_per_version(batch_groups: int, sync_interval: int) -> int:
    """G: groups the trainer trains between two weight versions."""
    return batch_groups * sync_interval


def run_bound(version: int, max_staleness: int, per_version: int, dropped: int) -> int:
    """The most groups all explorers together may have generated while their weights are `version`."""
    return (version + max_staleness + 1) * per_version + dropped


def explorer_share(room: int, slots: Iterable[int], num_slots: int) -> int:
    """One explorer's part of the headroom `room`: its units spread evenly over the slots (unit u to
    slot floor(u x num_slots / room)), and this explorer takes those of the slots it holds.

    The parts of all explorers add up to exactly `room`; a lone unit goes to the holder of slot 0.
    """
    if room <= 0:
        return 0
    # slot s gets the units u with s <= u * num_slots / room < s + 1
    return sum(-(-(s + 1) * room // num_slots) - -(-s * room // num_slots) for s in slots)


def headroom(engine_version: int, latest_version: int, max_staleness: int, per_version: int, generated: int,
             dropped: int, oldest_in_flight: int | None = None) -> int:
    """Groups all explorers together may still start now (<= 0: none).

    engine_version: weights loaded in the deciding explorer's engine; latest_version: the newest
    announced; generated: groups all explorers generated or are generating; dropped: generated
    groups that will never be trained; oldest_in_flight: the oldest weights any group open now is
    being generated with (another explorer's, or the deciding process's own: `AdmissionLog._decide`).
    Those groups will reach the trainer after the ones started now, so the bound is theirs: a group
    started earlier keeps its place when later ones overtake it.
    """
    if latest_version - engine_version > max_staleness:
        return 0  # already too stale before generating: load the newer weights first
    version = engine_version if oldest_in_flight is None else min(engine_version, oldest_in_flight)
    return run_bound(version, max_staleness, per_version, dropped) - generated


@dataclass
class Ledger:
    produced: int
    in_flight: int
    in_flight_version: int
    heard_at: float  # the reader's clock when the last record came in


@dataclass
class AdmissionView:
    """Everything `<ns>.admission` has said so far, folded: the other explorer processes' ledgers
    and the ids of the dropped groups (a redelivered drop counts once). `me` is this process: its
    own counts are known better locally than from its records."""

    me: str
    lease_s: float = LEASE_S
    ledgers: dict[str, Ledger] = field(default_factory=dict)
    dropped_ids: OnceWindow = field(default_factory=OnceWindow)  # a redelivered drop counts once

    def apply(self, record: ExplorerLedger | GroupDropped, now: float) -> None:
        if isinstance(record, GroupDropped):
            self.dropped_ids.add(record.group_id)
        elif record.explorer_id != self.me:
            old = self.ledgers.get(record.explorer_id)
            # counts only grow: a record delivered twice, late, must not lower them
            produced = max(record.produced, old.produced) if old else record.produced
            self.ledgers[record.explorer_id] = Ledger(produced, record.in_flight, record.in_flight_version, now)

    @property
    def dropped(self) -> int:
        return self.dropped_ids.count

    def oldest_in_flight(self, now: float) -> int | None:
        """The oldest weight version another process is generating with now (None: none is)."""
        return min((lg.in_flight_version for lg in self._live(now)), default=None)

    def _live(self, now: float) -> list[Ledger]:
        return [lg for lg in self.ledgers.values() if lg.in_flight and now - lg.heard_at <= self.lease_s]

    def generated(self, now: float, produced: int = 0, in_flight: int = 0) -> int:
        """Groups generated or being generated by every explorer process, this one's (`produced`,
        `in_flight`) included; a reservation not refreshed within `lease_s` no longer counts."""
        return (produced + in_flight + sum(lg.produced for lg in self.ledgers.values())
                + sum(lg.in_flight for lg in self._live(now)))
