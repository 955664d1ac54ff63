"""The off-policy diagnostics (`engine/algorithms/offpolicy.py`) on hand-derived values."""

import math

import pytest
import torch

from streamrft.engine.algorithms.offpolicy import OffPolicyStats, length_mix, model_turns, staleness_shares, turn_index


def test_turn_index_counts_runs_of_scored_tokens():
    mask = torch.tensor([[1, 1, 0, 1, 1, 0, 1], [0, 1, 0, 0, 0, 0, 0]])
    assert turn_index(mask).tolist() == [[0, 0, -1, 1, 1, -1, 2], [-1, 0, -1, -1, -1, -1, -1]]


def _batch():
    # weights w = exp(logp - behaviour): row 0 (A = +1) 1.5, 1.0, -, 0.5 (a second turn after an
    # environment token); row 1 (A = -1) 4.0, 0.5, 1.0, -
    w = torch.tensor([[1.5, 1.0, 1.0, 0.5], [4.0, 0.5, 1.0, 1.0]], dtype=torch.float64)
    logp = torch.zeros(2, 4, dtype=torch.float64)
    return logp, -torch.log(w), torch.tensor([1.0, -1.0]), torch.tensor([[1, 1, 0, 1], [1, 1, 1, 0]])


def test_weights_clip_shares_by_sign_and_turn_hand_values():
    s = OffPolicyStats(clip_low=0.2, clip_high=0.2)
    s.add(*_batch())
    r = s.result()
    # 6 scored tokens: sum w = 8.5, sum w^2 = 20.75
    assert r["iw_mean"] == pytest.approx(8.5 / 6)
    assert r["iw_max"] == pytest.approx(4.0)
    assert r["iw_ess"] == pytest.approx(8.5 ** 2 / (6 * 20.75))
    # positive: 1.5 > 1.2 clipped, 1.0 and 0.5 not (the upper bound only); negative: 0.5 < 0.8 clipped,
    # 4.0 not clipped but over c = 3 (no dual clip set: 3 is the reference)
    assert r["clip_frac_pos"] == pytest.approx(1 / 3)
    assert r["clip_frac_neg"] == pytest.approx(1 / 3)
    assert r["neg_iw_over_c"] == pytest.approx(1 / 3)
    # first turns: row 0's two tokens and row 1's three, two clipped; row 0's second turn: none
    assert r["clip_frac_turn0"] == pytest.approx(2 / 5)
    assert r["clip_frac_turn1"] == 0.0
    assert "clip_frac_turn2p" not in r  # no third turn: left out, not 0


def test_micro_batches_add_up_to_the_batch():
    logp, behav, adv, mask = _batch()
    whole, parts = OffPolicyStats(clip_c=5.0), OffPolicyStats(clip_c=5.0)
    whole.add(logp, behav, adv, mask)
    for rows in ([0], [1]):
        parts.add(logp[rows], behav[rows], adv[rows], mask[rows])
    assert whole.result() == pytest.approx(parts.result())
    assert whole.result()["neg_iw_over_c"] == 0.0  # 4.0 is under c = 5


def test_token_advantages_and_an_empty_batch():
    s = OffPolicyStats()
    s.add(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2))
    assert s.result() == {}
    s.add(torch.zeros(1, 2), torch.tensor([[math.log(2.0), 0.0]]), torch.tensor([[-1.0, 1.0]]), torch.ones(1, 2))
    r = s.result()  # w = 0.5 (A < 0: clipped below), 1.0 (A > 0)
    assert r["clip_frac_neg"] == 1.0 and r["clip_frac_pos"] == 0.0 and r["iw_mean"] == pytest.approx(0.75)


def test_staleness_shares():
    assert staleness_shares([0, 1, 1, 3]) == {"staleness_0": 0.25, "staleness_1": 0.5, "staleness_2p": 0.25}
    assert staleness_shares([]) == {}


def test_model_turns_counts_runs_of_ones_as_turn_index_does():
    for mask in ([1, 1, 0, 1, 1, 0, 1], [0, 1, 0, 0, 0, 0, 0], [0, 0], [], [1], [0, 1, 1, 0, 1, 0]):
        want = int(turn_index(torch.tensor([mask or [0]])).max()) + 1
        assert model_turns(mask) == want, mask
    assert model_turns([1, 0, 1, 0, 1, 1, 0, 1]) == 4


def test_length_mix_shares_and_staleness_by_episode_length():
    # five samples: 1, 1, 2, 4 and 3 turns, 0, 1, 1, 2 and 3 versions stale
    r = length_mix([1, 1, 2, 4, 3], [0, 1, 1, 2, 3])
    assert r == pytest.approx({"turns_1": 2 / 5, "turns_2": 1 / 5, "turns_3p": 2 / 5,
                               "staleness_turns_1": 0.5, "staleness_turns_2": 1.0, "staleness_turns_3p": 2.5})
    # no two-turn episode: its share is 0, its staleness left out; an empty mask counts as one turn
    r = length_mix([0, 3], [2, 0])
    assert r == {"turns_1": 0.5, "turns_2": 0.0, "turns_3p": 0.5, "staleness_turns_1": 2.0, "staleness_turns_3p": 0.0}
    assert length_mix([], []) == {}
