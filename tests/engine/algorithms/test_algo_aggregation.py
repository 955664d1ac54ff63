"""Hand-computed values of every aggregation mode, and its errors."""

import math

import pytest
import torch

from streamrft.engine.algorithms import AGGREGATIONS, aggregate, masked_mean

# two sequences: row 0 has valid tokens 1, 2 (length 2), row 1 has the single token 4
LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])


def test_token_mean():
    # (1 + 2 + 4) / 3 tokens
    assert aggregate(LOSS, MASK, "token-mean").item() == pytest.approx(7 / 3)
    # global count of 7 tokens in the step: 7 / 7
    assert aggregate(LOSS, MASK, "token-mean", global_tokens=7).item() == pytest.approx(1.0)


def test_seq_mean_token_sum():
    # ((1 + 2) + 4) / 2 sequences
    assert aggregate(LOSS, MASK, "seq-mean-token-sum").item() == pytest.approx(3.5)
    # 7 / 4 sequences in the whole step
    assert aggregate(LOSS, MASK, "seq-mean-token-sum", global_seqs=4).item() == pytest.approx(1.75)


def test_seq_mean_token_mean():
    # ((1 + 2) / 2 + 4 / 1) / 2 = (1.5 + 4) / 2
    assert aggregate(LOSS, MASK, "seq-mean-token-mean").item() == pytest.approx(2.75)
    # the global count is sequences, not tokens: 5.5 / 11
    got = aggregate(LOSS, MASK, "seq-mean-token-mean", global_tokens=999, global_seqs=11)
    assert got.item() == pytest.approx(0.5)


def test_seq_mean_token_sum_norm():
    # (3 / 4 + 4 / 4) / 2 with the constant norm_len 4
    got = aggregate(LOSS, MASK, "seq-mean-token-sum-norm", norm_len=4)
    assert got.item() == pytest.approx(0.875)
    with pytest.raises(ValueError, match="norm_len"):
        aggregate(LOSS, MASK, "seq-mean-token-sum-norm")


@pytest.mark.parametrize("mode", sorted(AGGREGATIONS))
def test_padding_rows_and_nan_on_masked_positions_change_nothing(mode):
    padded_loss = torch.cat([LOSS, torch.full((1, 3), 9.0, dtype=torch.float64)])
    padded_loss[0, 2] = math.nan
    padded_mask = torch.cat([MASK, torch.zeros(1, 3, dtype=MASK.dtype)])
    expected = aggregate(LOSS, MASK, mode, norm_len=4)
    got = aggregate(padded_loss, padded_mask, mode, norm_len=4)
    assert got.item() == pytest.approx(expected.item())


def test_empty_mask_gives_zero_not_nan():
    zero_mask = torch.zeros_like(MASK)
    for mode in AGGREGATIONS:
        assert aggregate(LOSS, zero_mask, mode, norm_len=4).item() == 0.0


def test_tensor_global_counts_accepted():
    got = aggregate(LOSS, MASK, "token-mean", global_tokens=torch.tensor(14))
    assert got.item() == pytest.approx(0.5)


def test_unknown_mode_lists_allowed():
    with pytest.raises(ValueError, match="'token-sum'.*seq-mean-token-mean.*token-mean"):
        aggregate(LOSS, MASK, "token-sum")


def test_masked_mean():
    # (1 + 2 + 4) / 3, a python float
    got = masked_mean(LOSS, MASK.bool())
    assert isinstance(got, float) and got == pytest.approx(7 / 3)
