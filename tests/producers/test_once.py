"""`OnceWindow`: each id counted once within the newest `window`, in bounded memory; a snapshot
restores exactly what a fold from the start reaches."""
from __future__ import annotations

import random

import pytest

from streamrft.producers.once import OnceWindow


def test_an_id_counts_once_within_the_window_and_again_once_forgotten():
    w = OnceWindow(window=3)
    assert [w.add(k) for k in "abca"] == [True, True, True, False]  # a again: within the newest 3
    assert w.add("d") and "a" not in w  # d pushes a out (a, b, c, d: a is the oldest)
    assert w.add("a")  # a copy that late counts again
    assert (w.count, len(w._recent)) == (5, 3)
    assert w.state() == {"count": 5, "recent": ["c", "d", "a"]}


def test_a_restored_snapshot_folds_on_as_a_fold_from_the_start():
    rng = random.Random(0)
    ids = [f"g{rng.randrange(400)}" for _ in range(3000)]  # many repeats, some within the window, some not
    whole = OnceWindow(window=100)
    counted = [whole.add(k) for k in ids]
    for cut in (0, 1, 99, 1500, 2999):
        first = OnceWindow(window=100)
        head = [first.add(k) for k in ids[:cut]]
        restored = OnceWindow.from_state(first.state(), window=100)
        tail = [restored.add(k) for k in ids[cut:]]
        assert head + tail == counted
        assert restored.state() == whole.state()


def test_the_older_snapshot_format_every_id_sorted_still_restores():
    w = OnceWindow.from_state(["a", "b", "c"], window=2)
    assert w.count == 3 and "c" in w and "a" not in w


def test_a_window_below_one_is_refused():
    with pytest.raises(ValueError, match="window=0"):
        OnceWindow(0)
