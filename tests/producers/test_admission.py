import pytest

from streamrft.producers.admission import AdmissionView, explorer_share, groups_per_version, headroom, run_bound
from streamrft.schemas import ExplorerLedger, GroupDropped


def test_groups_per_version_is_what_the_trainer_takes_between_two_versions():
    assert groups_per_version(batch_groups=8, sync_interval=1) == 8
    assert groups_per_version(batch_groups=3, sync_interval=2) == 6


def test_run_bound_is_the_areal_rule_plus_the_groups_never_trained():
    # (version + max_staleness + 1) * groups_per_version + dropped
    assert run_bound(version=0, max_staleness=2, per_version=8, dropped=0) == 24  # the CPU demo at start
    assert run_bound(5, 2, 8, 3) == 67                                              # 8 * 8 + 3
    assert run_bound(4, 0, 8, 0) == 40    # on-policy: one version's worth ahead of the trainer's 4 * 8


def test_explorer_share_spreads_the_headroom_over_the_slots_and_the_shares_add_up_to_it():
    first, second = range(32), range(32, 64)  # two explorers, half the slots each (range assignor)
    assert explorer_share(room=8, slots=first, num_slots=64) == 4
    assert explorer_share(8, range(64), 64) == 8                          # alone: all of it
    assert explorer_share(7, first, 64) == 4                              # ceil(32 * 7 / 64) = ceil(3.5)
    assert explorer_share(7, second, 64) == 3                             # 7 - 4: never 4 + 4
    # three explorers (22, 21, 21 slots): ceil(22 * 24 / 64) = 9, ceil(43 * 24 / 64) - 9 = 8, 24 - 17 = 7
    assert [explorer_share(24, r, 64) for r in (range(22), range(22, 43), range(43, 64))] == [9, 8, 7]
    assert explorer_share(1, first, 64) == 1 and explorer_share(1, second, 64) == 0  # a lone unit: slot 0's
    assert explorer_share(100, range(64), 64) == 100                      # more units than slots
    assert explorer_share(0, first, 64) == 0                              # no headroom
    assert explorer_share(-3, range(64), 64) == 0                         # over the bound (a late drop seen)
    assert explorer_share(8, (), 64) == 0                                 # no slot
    for room in range(40):  # whatever the headroom, the parts add up to it exactly
        assert sum(explorer_share(room, r, 64) for r in (range(5), range(5, 40), range(40, 64))) == room


def test_headroom():
    demo = dict(max_staleness=2, per_version=8)
    assert headroom(0, 0, generated=0, dropped=0, **demo) == 24       # the CPU demo at start
    # a slow trainer: explorers at its version 5 have generated (5 + 2 + 1) * 8 = 64 groups: wait
    assert headroom(5, 5, generated=64, dropped=0, **demo) == 0
    assert headroom(5, 5, generated=64, dropped=3, **demo) == 3       # three of them were filtered
    assert headroom(5, 5, generated=66, dropped=0, **demo) == -2      # over (a reservation overlapped a drop)
    # the engine still holds v3 while v6 is announced: too stale before starting, load v6 first
    assert headroom(3, 6, generated=0, dropped=0, **demo) == 0
    assert headroom(4, 5, generated=54, dropped=0, **demo) == 2       # older weights: the bound is 56, not 64
    # another explorer still generates with v3: groups started now overtake its groups, so v3's bound
    # ((3 + 2 + 1) x 8 = 48) holds, not v5's 64 (a group started earlier keeps its place)
    assert headroom(5, 5, generated=46, dropped=0, oldest_in_flight=3, **demo) == 2
    assert headroom(5, 5, generated=46, dropped=0, oldest_in_flight=5, **demo) == 18
    # on-policy: the trainer at v4 wants its 8 groups of v4; 36 generated so far leave 4
    assert headroom(4, 4, 0, 8, generated=36, dropped=0) == 4
    assert headroom(4, 4, 0, 8, generated=40, dropped=0) == 0
    assert headroom(4, 4, 0, 8, generated=40, dropped=2) == 2         # two were filtered: replace them


def _ledger(who: str, produced: int, in_flight: int = 0, version: int = 0) -> ExplorerLedger:
    return ExplorerLedger(explorer_id=who, produced=produced, in_flight=in_flight, in_flight_version=version)


def test_view_adds_every_process_and_counts_each_dropped_group_once():
    view = AdmissionView(me="me", lease_s=20)
    view.apply(_ledger("a", 10), now=0)
    view.apply(_ledger("b", 3, in_flight=4, version=6), now=0)
    view.apply(_ledger("a", 12, in_flight=2, version=7), now=1)   # a's newer ledger replaces its older one
    view.apply(_ledger("me", 99, in_flight=9), now=1)  # our own records: we know better locally
    for reason in ("filtered", "stale", "filtered"):   # g1 redelivered after a stream-ops restart
        view.apply(GroupDropped(group_id="g1", reason=reason), now=1)
    view.apply(GroupDropped(group_id="g2", reason="dead_letter"), now=1)
    assert view.dropped == 2
    # 12 + 2 (a) + 3 + 4 (b) + this process's 5 produced and 1 in flight
    assert view.generated(now=2, produced=5, in_flight=1) == 27
    assert view.oldest_in_flight(now=2) == 6
    view.apply(_ledger("b", 7), now=3)                  # b published its batch
    assert view.oldest_in_flight(now=3) == 7 and view.generated(now=3) == 12 + 2 + 7


def test_view_lets_a_dead_process_reservation_lapse_but_keeps_what_it_produced():
    view = AdmissionView(me="me", lease_s=20)
    view.apply(_ledger("killed", 8, in_flight=4, version=3), now=100)
    assert view.generated(now=120) == 12   # within the lease: its batch may still come
    assert view.oldest_in_flight(now=120) == 3
    assert view.generated(now=120.5) == 8  # no refresh: killed mid-batch, its 8 groups stay counted
    assert view.oldest_in_flight(now=120.5) is None
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
    cuts = [e * 64 // explorers for e in range(explorers + 1)]
    slots = [range(cuts[e], cuts[e + 1]) for e in range(explorers)]
    for tick in range(max_ticks):
        if version >= versions:
            return {"ticks": tick, "stale": stale, "trained": trained, "generated": generated}
        for held in slots:
            n = min(batch, explorer_share(headroom(version, version, max_staleness, per_version, generated, dropped),
                                          held, 64))
            for _ in range(min(n, explorer_rate)):
                queue.append((generated, version))
                generated += 1
        assert generated - dropped <= (version + max_staleness + 1) * per_version  # AReaL's bound, exactly
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


@pytest.mark.parametrize("explorers", [1, 3, 5])
def test_no_deadlock_whatever_the_number_of_explorers(explorers):
    out = simulate(0, per_version=4, versions=20, filtered={0, 1}, period=3, explorers=explorers, batch=2,
                   explorer_rate=1, trainer_rate=3)
    assert out["trained"] == 20 * 4 and out["stale"] == 0
