"""`explorer.publish_order`: finished groups published in admission order, each waiting a bounded
time for older ones; against finish order, on hand-made and on seeded streams."""
from __future__ import annotations

import random

from streamrft.producers.release_order import ReleaseOrder


def test_a_group_admitted_first_and_finished_last_goes_out_first_and_holds_the_others_no_longer_than_the_bound():
    order = ReleaseOrder(wait_s=10.0)
    first, second, third = order.admit(), order.admit(), order.admit()
    order.finish(second, "b", now=1.0)
    order.finish(third, "c", now=2.0)
    assert order.due(3.0) == [] and order.held() == 2  # both wait for `first`
    order.finish(first, "a", now=5.0)
    assert order.due(5.0) == ["a", "b", "c"]
    assert (order.overtook, order.waited_out) == (0, 0)


def test_the_wait_is_bounded_and_a_cancelled_group_holds_nothing():
    order = ReleaseOrder(wait_s=3.0)
    slow, fast, later, dropped = (order.admit() for _ in range(4))
    order.finish(fast, "fast", now=1.0)
    order.finish(later, "later", now=2.0)
    assert order.due(3.9) == []
    assert order.due(4.0) == ["fast"]  # waited 3 s for `slow`: goes out without it
    assert order.due(5.0) == ["later"]
    assert (order.overtook, order.waited_out) == (2, 2)
    order.cancel(slow)
    order.finish(dropped, "x", now=6.0)  # nothing older is open any more
    assert order.due(6.0) == ["x"]


def test_finished_order_publishes_at_once_and_counts_what_overtook():
    order = ReleaseOrder(wait_s=None)
    slow, fast = order.admit(), order.admit()
    order.finish(fast, "fast", now=1.0)
    assert order.due(1.0) == ["fast"] and order.overtook == 1 and order.waited_out == 0
    order.finish(slow, "slow", now=9.0)
    assert order.due(9.0) == ["slow"] and order.overtook == 1


def test_on_stop_every_finished_group_goes_out_in_admission_order():
    order = ReleaseOrder(wait_s=30.0)
    a, b, c = order.admit(), order.admit(), order.admit()
    order.finish(c, "c", now=1.0)
    order.finish(b, "b", now=2.0)
    assert order.due(2.5) == []
    assert order.due(2.5, everything=True) == ["b", "c"] and order.waited_out == 0


def simulate(wait_s: float | None, seed: int, groups: int = 96, in_flight: int = 8, slow_share: float = 1 / 6):
    """Groups admitted one at a time while `in_flight` are open, a slow task (4 tool steps) or a fast
    one (1 step), each step a seeded lognormal delay (median 0.5 s, as env_latency's tool); returns
    (tasks in admission order, tasks in the order published)."""
    rng = random.Random(seed)
    order = ReleaseOrder(wait_s)
    admitted, published, running, now = [], [], {}, 0.0
    while len(admitted) < groups or running or order.held():
        while len(running) < in_flight and len(admitted) < groups:
            task = "slow" if rng.random() < slow_share else "fast"
            steps = 4 if task == "slow" else 1
            # a group ends with its slowest episode (8 of them)
            took = max(sum(rng.lognormvariate(-0.69, 0.9) for _ in range(steps)) for _ in range(8))
            running[order.admit()] = (now + took, task)
            admitted.append(task)
        seq, (end, task) = min(running.items(), key=lambda kv: kv[1][0])
        now = end
        del running[seq]
        order.finish(seq, task, now)
        published += order.due(now)
        if not running and len(admitted) == groups:
            published += order.due(now, everything=True)
    return admitted, published


def test_batches_published_in_admission_order_carry_the_task_mix_admitted_finish_order_does_not():
    batch = 8
    gaps = {"admitted": [], "finished": []}
    for seed in range(20):
        for name, wait in (("admitted", 1e9), ("finished", None)):
            admitted, published = simulate(wait, seed)
            assert sorted(published) == sorted(admitted)  # every group goes out once
            if name == "admitted":
                assert published == admitted  # the same order: every batch's mix is the admitted one's
            # the slow task's share of the first two batches, against its share of what was admitted then
            first = 2 * batch
            gaps[name].append(published[:first].count("slow") / first - admitted[:first].count("slow") / first)
    assert max(abs(g) for g in gaps["admitted"]) == 0
    assert sum(gaps["finished"]) / len(gaps["finished"]) < -0.04  # finish order: slow tasks trained late
