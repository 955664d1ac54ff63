"""A trajectory's reward from its ratings, hand-derived."""
import math

import pytest

from streamrft.stream_ops.feedback.aggregate import bradley_terry, majority_reward, mean_reward

VALUES = {"good": 1.0, "ok": 0.5, "bad": 0.0}


def test_mean_counts_labels_as_their_values():
    assert mean_reward([1.0, 0.0], ["ok"], VALUES) == pytest.approx(0.5)  # (1 + 0 + 0.5) / 3
    assert mean_reward([], ["good", "bad", "bad"], VALUES) == pytest.approx(1 / 3)
    with pytest.raises(ValueError):
        mean_reward([], [], VALUES)


def test_majority_takes_the_most_frequent_label_and_the_first_listed_on_a_tie():
    assert majority_reward(["bad", "good", "bad"], VALUES) == 0.0
    assert majority_reward(["bad", "good"], VALUES) == 1.0  # a tie: "good" is listed first
    with pytest.raises(ValueError):
        majority_reward([], VALUES)


def test_bradley_terry_of_two_items_is_their_log_odds_with_one_virtual_tie():
    # a beat b 3 times, b beat a once; with half a win added each way: 3.5 against 1.5, so
    # s_a / s_b = 7/3 and the centred log-strengths are +-log(7/3)/2
    got = bradley_terry(["a", "b", "c"], [("a", "b")] * 3 + [("b", "a"), ("a", "zz")])
    assert got["a"] - got["b"] == pytest.approx(math.log(7 / 3), abs=1e-6)
    # the compared items' strengths have geometric mean 1 (log-strengths +-L/2), and c, never
    # compared, 0: the three already average 0
    assert got["a"] == pytest.approx(math.log(7 / 3) / 2, abs=1e-6) and got["c"] == pytest.approx(0.0, abs=1e-9)


def test_bradley_terry_orders_a_chain_and_stays_finite_for_an_item_that_always_won():
    got = bradley_terry(["a", "b", "c"], [("a", "b"), ("a", "b"), ("b", "c"), ("b", "c"), ("a", "c")])
    assert got["a"] > got["b"] > got["c"] and all(math.isfinite(v) for v in got.values())
    assert sum(got.values()) == pytest.approx(0.0, abs=1e-9)
