import pytest

from streamrft.producers.admission import (AdmissionView, explorer_share, groups_per_version, groups_to_start,
                                           run_bound)
from streamrft.schemas import ExplorerLedger, GroupDropped


def test_groups_per_version_is_what_the_trainer_takes_between_two_versions():
    assert groups_per_version(batch_groups=8, sync_interval=1) == 8
    assert groups_per_version(batch_groups=3, sync_interval=2) == 6


def test_run_bound_is_the_areal_rule_plus_the_groups_never_trained():
    # (version + max_staleness + 1) * groups_per_version + dropped
    assert run_bound(version=0, max_staleness=2, per_version=8, dropped=0) == 24  # the CPU demo at start
    assert run_bound(5, 2, 8, 3) == 67                                              # 8 * 8 + 3
    assert run_bound(4, 0, 8, 0) == 40    # on-policy: one version's worth ahead of the trainer's 4 * 8


def test_explorer_share_follows_the_slots_held():
    assert explorer_share(headroom=8, slots=32, num_slots=64) == 4     # two explorers, half the slots each
    assert explorer_share(8, 64, 64) == 8                              # alone: all of it
    assert explorer_share(7, 32, 64) == 4                              # 3.5 rounded up
    assert explorer_share(24, 22, 64) == 9                             # 8.25 rounded up
    assert explorer_share(1, 1, 64) == 1                               # never 0 while a slot and headroom
    assert explorer_share(0, 64, 64) == 0                              # no headroom
    assert explorer_share(-3, 64, 64) == 0                             # over the bound (e.g. a late drop seen)
    assert explorer_share(8, 0, 64) == 0                               # no slot


def test_groups_to_start():
    demo = dict(max_staleness=2, per_version=8, slots=32, num_slots=64, batch=4)
    # the CPU demo's first batch: headroom 24, half of it is 12, one batch is 4
    assert groups_to_start(0, 0, generated=0, dropped=0, **demo) == 4
    # a slow trainer: explorers at its version 5 have generated (5 + 2 + 1) * 8 = 64 groups: wait
    assert groups_to_start(5, 5, generated=64, dropped=0, **demo) == 0
    # three of those were filtered: headroom 3, half of it rounded up
    assert groups_to_start(5, 5, generated=64, dropped=3, **demo) == 2
    # the engine still holds v3 while v6 is announced: too stale before starting, load v6 first
    assert groups_to_start(3, 6, generated=0, dropped=0, **demo) == 0
    # older weights leave less headroom: with v4 loaded the bound is 56, not 64
    assert groups_to_start(4, 5, generated=54, dropped=0, **demo) == 1
    # on-policy: the trainer at v4 wants its 8 groups of v4; 36 generated so far leave 4
    sync = dict(max_staleness=0, per_version=8, slots=64, num_slots=64, batch=8)
    assert groups_to_start(4, 4, generated=36, dropped=0, **sync) == 4
    assert groups_to_start(4, 4, generated=40, dropped=0, **sync) == 0
    assert groups_to_start(4, 4, generated=40, dropped=2, **sync) == 2  # two were filtered: replace them


def _ledger(who: str, produced: int, in_flight: int = 0) -> ExplorerLedger:
    return ExplorerLedger(explorer_id=who, produced=produced, in_flight=in_flight)


def test_view_adds_every_process_and_counts_each_dropped_group_once():
    view = AdmissionView(me="me", lease_s=20)
    view.apply(_ledger("a", 10), now=0)
    view.apply(_ledger("b", 3, in_flight=4), now=0)
    view.apply(_ledger("a", 12, in_flight=2), now=1)   # a's newer ledger replaces its older one
    view.apply(_ledger("me", 99, in_flight=9), now=1)  # our own records: we know better locally
    for reason in ("filtered", "stale", "filtered"):   # g1 redelivered after a stream-ops restart
        view.apply(GroupDropped(group_id="g1", reason=reason), now=1)
    view.apply(GroupDropped(group_id="g2", reason="dead_letter"), now=1)
    assert view.dropped == 2
    # 12 + 2 (a) + 3 + 4 (b) + this process's 5 produced and 1 in flight
    assert view.generated(now=2, produced=5, in_flight=1) == 27


def test_view_lets_a_dead_process_reservation_lapse_but_keeps_what_it_produced():
    view = AdmissionView(me="me", lease_s=20)
    view.apply(_ledger("killed", 8, in_flight=4), now=100)
    assert view.generated(now=120) == 12   # within the lease: its batch may still come
    assert view.generated(now=120.5) == 8  # no refresh: killed mid-batch, its 8 groups stay counted
    view.apply(_ledger("killed", 8, in_flight=4), now=130)
    assert view.generated(now=131) == 12   # a refresh renews the lease


def test_view_counts_never_go_down_on_a_late_copy():
    view = AdmissionView(me="me")
    view.apply(_ledger("a", 10), now=0)
    view.apply(_ledger("a", 6, in_flight=1), now=1)  # an older record delivered again, late
    assert view.generated(now=1) == 11


def simulate(max_staleness: int, per_version: int, versions: int, filtered: set[int], period: int,
             explorers: int = 2, batch: int = 4, explorer_rate: int = 4, trainer_rate: int = 2,
             max_ticks: int = 20_000) -> dict:
    """Explorers, stream ops and a FIFO trainer in ticks, with admission decided by the pure functions.

    Group i is filtered when i % period is in `filtered`; its drop is seen only when the trainer
    reaches it (the latest stream ops could report it). Explorers load each version at once and
    generate up to `explorer_rate` groups a tick; the trainer takes up to `trainer_rate` a tick.
    """
    queue, generated, dropped, version, trained_in_version = [], 0, 0, 0, 0
    stale = trained = 0
    slots = [64 // explorers + (1 if e < 64 % explorers else 0) for e in range(explorers)]
    for tick in range(max_ticks):
        if version >= versions:
            return {"ticks": tick, "stale": stale, "trained": trained, "generated": generated}
        for held in slots:
            n = groups_to_start(version, version, max_staleness, per_version, generated, dropped, held, 64, batch)
            for _ in range(min(n, explorer_rate)):
                queue.append((generated, version))
                generated += 1
        for _ in range(trainer_rate):
            if not queue:
                break
            i, v = queue.pop(0)
            if i % period in filtered:
                dropped += 1
            elif version - v > max_staleness:
                stale += 1
                dropped += 1
            else:
                trained += 1
                trained_in_version += 1
                if trained_in_version == per_version:
                    version, trained_in_version = version + 1, 0
    raise AssertionError(f"deadlock: version {version} after {max_ticks} ticks, {len(queue)} queued, "
                         f"{generated} generated, {dropped} dropped")


@pytest.mark.parametrize("max_staleness", [0, 1, 2])
@pytest.mark.parametrize("filtered", [set(), {1, 2, 3}, {0, 1, 2, 3, 4, 5, 6, 7, 8}], ids=["none", "75%", "90%"])
@pytest.mark.parametrize("rates", [(4, 1), (1, 8)], ids=["slow-trainer", "slow-explorers"])
def test_no_deadlock_and_nothing_stale_in_order(max_staleness, filtered, rates):
    period = 10 if len(filtered) == 9 else 4
    out = simulate(max_staleness, per_version=8, versions=30, filtered=filtered, period=period,
                   explorer_rate=rates[0], trainer_rate=rates[1])
    assert out["trained"] == 30 * 8
    assert out["stale"] == 0  # the bound is exact when groups reach the trainer in order
