"""Hand-computed advantages: group-level, batch-level, GAE, step broadcast, distillation."""

import math

import pytest
import torch

from streamrft.engine.algorithms import broadcast_to_steps
from streamrft.engine.algorithms.advantages import (
    dr_grpo,
    gae,
    grpo,
    opd,
    opmd,
    reinforce_pp,
    rloo,
)


def close(got, expected, tol=1e-5):
    return torch.allclose(got.double(), torch.tensor(expected, dtype=torch.float64), atol=tol)


def test_grpo_unbiased_and_biased_std():
    # rewards 1, 0, 0, 1: mean 0.5, deviations +-0.5
    # unbiased var = 4 * 0.25 / 3 = 1/3, std 0.577350 -> 0.5 / 0.577350 = 0.866025
    assert close(grpo([1.0, 0.0, 0.0, 1.0], eps=0.0), [0.866025, -0.866025, -0.866025, 0.866025])
    # population var = 0.25, std 0.5 -> +-1
    got = grpo(torch.tensor([1.0, 0.0, 0.0, 1.0]), eps=0.0, unbiased=False)
    assert close(got, [1.0, -1.0, -1.0, 1.0])


def test_grpo_degenerate_groups_are_zero():
    assert close(grpo([2.0]), [0.0])
    # equal rewards: (r - mean) = 0, divided by 0 + eps
    assert close(grpo([1, 1, 1]), [0.0, 0.0, 0.0])


def test_dr_grpo_has_no_std():
    # mean 2 -> 3 - 2, 1 - 2, 2 - 2
    assert close(dr_grpo([3.0, 1.0, 2.0]), [1.0, -1.0, 0.0])


def test_rloo_hand_values():
    # 1 - (0+0+1)/3 = 2/3 ; 0 - (1+0+1)/3 = -2/3
    assert close(rloo([1.0, 0.0, 0.0, 1.0]), [2 / 3, -2 / 3, -2 / 3, 2 / 3])
    # 3 - (1+2)/2 = 1.5 ; 1 - (3+2)/2 = -1.5 ; 2 - (3+1)/2 = 0
    assert close(rloo(torch.tensor([3.0, 1.0, 2.0])), [1.5, -1.5, 0.0])
    assert close(rloo([5.0]), [0.0])


def test_opmd_mean_and_soft_baseline():
    assert close(opmd([1.0, 0.0, 0.0, 1.0]), [0.5, -0.5, -0.5, 0.5])
    # tau = 1, rewards 0 and ln 3: mean(exp r) = (1 + 3) / 2 = 2, baseline ln 2 = 0.693147
    got = opmd([0.0, math.log(3.0)], tau=1.0)
    assert close(got, [-0.693147, 1.098612 - 0.693147])


def test_reinforce_pp_whitens_sequence_rewards_over_the_batch():
    # rewards 1, 2, 3, 6: mean 3, deviations -2, -1, 0, 3, sum of squares 14,
    # unbiased std sqrt(14 / 3) = 2.160247
    got = reinforce_pp(torch.tensor([1.0, 2.0, 3.0, 6.0]), eps=0.0)
    assert close(got, [-0.925820, -0.462910, 0.0, 1.388730])


def test_reinforce_pp_token_returns_whitened_over_valid_tokens():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 7.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    # returns-to-go (gamma 1): row 0 -> 1, 1, 1; row 1 -> 2, 2 (the 7 is padding)
    # valid returns 1,1,1,2,2: mean 1.4, sum sq dev 3*0.16 + 2*0.36 = 1.2, var 1.2/4 = 0.3
    # std 0.547723 -> -0.4 / std = -0.730297, 0.6 / std = 1.095445
    got = reinforce_pp(rewards, mask, eps=0.0)
    a, b = -0.730297, 1.095445
    assert close(got, [[a, a, a], [b, b, 0.0]])


def test_reinforce_pp_discount():
    # gamma 0.5: returns 0.25, 0.5, 1; mean 0.583333, unbiased std 0.381881
    got = reinforce_pp(torch.tensor([[0.0, 0.0, 1.0]]), torch.ones(1, 3), gamma=0.5, eps=0.0)
    assert close(got, [[-0.872872, -0.218218, 1.091089]])


def test_gae_gamma_lam_one_is_reward_to_go_minus_value():
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.5, 0.0, 0.0, 0.0]])
    values = torch.tensor([[0.5, 0.2, 0.1, 9.0], [0.3, 0.4, 8.0, 8.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    # reward-to-go: row 0 -> 1, 1, 1 ; row 1 -> 0.5, 0
    assert close(adv, [[0.5, 0.8, 0.9, 0.0], [0.2, -0.4, 0.0, 0.0]])
    assert close(ret, [[1.0, 1.0, 1.0, 0.0], [0.5, 0.0, 0.0, 0.0]])


def test_gae_hand_values_and_skipped_observation_tokens():
    # gamma 0.9, lam 0.5, values 0.5 0.2 0.1, reward 1 on the last token:
    # t2: delta = 1 - 0.1 = 0.9                       A2 = 0.9
    # t1: delta = 0.9*0.1 - 0.2 = -0.11                A1 = -0.11 + 0.45*0.9 = 0.295
    # t0: delta = 0.9*0.2 - 0.5 = -0.32                A0 = -0.32 + 0.45*0.295 = -0.18725
    adv, ret = gae(
        torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.5, 0.2, 0.1]]), torch.ones(1, 3), 0.9, 0.5
    )
    assert close(adv, [[-0.18725, 0.295, 0.9]])
    assert close(ret, [[0.31275, 0.495, 1.0]])
    # an environment token (masked) inside the sequence is skipped, whatever it holds
    adv, _ = gae(
        torch.tensor([[0.0, 5.0, 0.0, 1.0]]),
        torch.tensor([[0.5, 7.0, 0.2, 0.1]]),
        torch.tensor([[1, 0, 1, 1]]),
        0.9,
        0.5,
    )
    assert close(adv, [[-0.18725, 0.0, 0.295, 0.9]])


def test_broadcast_to_steps():
    got = broadcast_to_steps(torch.tensor([1.0, -2.0]), [2, 3])
    assert close(got, [1.0, 1.0, -2.0, -2.0, -2.0])
    with pytest.raises(ValueError):
        broadcast_to_steps(torch.tensor([1.0, -2.0]), [2])


def test_opd_is_teacher_minus_student_masked_and_detached():
    student = torch.tensor([[-1.5, -1.0]], requires_grad=True)
    got = opd(torch.tensor([[-1.0, -2.0]]), student, torch.tensor([[1, 0]]))
    # -1 - (-1.5) = 0.5 ; masked -> 0
    assert close(got, [[0.5, 0.0]])
    assert not got.requires_grad
