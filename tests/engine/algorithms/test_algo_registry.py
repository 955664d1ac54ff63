"""The public tables, `resolve` and its import_path escape hatch, PRESETS, policy_objective."""

import pytest
import torch

from streamrft.engine.algorithms import (
    ADVANTAGES,
    AGGREGATIONS,
    KL_ESTIMATORS,
    OFFLINE_LOSSES,
    POLICY_LOSSES,
    PRESETS,
    policy_objective,
    resolve,
)
from streamrft.engine.algorithms.kl import k1
from streamrft.engine.algorithms.policy_losses import pg

NOT_CALLABLE = 3


def my_advantage(rewards):
    return torch.as_tensor(rewards) * 2


def test_resolve_by_name():
    assert resolve(POLICY_LOSSES, "ppo", None) is POLICY_LOSSES["ppo"]
    assert resolve(KL_ESTIMATORS, "k3") is KL_ESTIMATORS["k3"]


def test_unknown_or_missing_name_lists_the_allowed_ones():
    with pytest.raises(ValueError, match=r"'grpoo'.*cispo, decoupled_ppo, gspo, pg, ppo, sft"):
        resolve(POLICY_LOSSES, "grpoo", None)
    with pytest.raises(ValueError, match="None.*dr_grpo"):
        resolve(ADVANTAGES, None, None)


def test_import_path_resolves_a_function_of_this_module():
    fn = resolve(ADVANTAGES, "grpo", f"{__name__}:my_advantage")
    assert fn is my_advantage
    assert fn([1.0]).tolist() == [2.0]


def test_bad_import_paths():
    with pytest.raises(ValueError, match="pkg.module:function"):
        resolve(ADVANTAGES, None, f"{__name__}.my_advantage")
    with pytest.raises(ValueError, match="callable"):
        resolve(ADVANTAGES, None, f"{__name__}:NOT_CALLABLE")
    with pytest.raises(ModuleNotFoundError):
        resolve(ADVANTAGES, None, "no_such_module_xyz:fn")


def test_presets_cover_exactly_the_algorithm_types_and_name_real_entries():
    assert set(PRESETS) == {
        "grpo", "dr_grpo", "ppo", "rloo", "reinforce_pp", "gspo", "cispo", "opd",
        "sft", "dpo", "kto",
    }  # fmt: skip
    for algo, preset in PRESETS.items():
        assert set(preset) == {"advantage", "policy_loss", "aggregation"}
        assert preset["aggregation"] in AGGREGATIONS
        if algo in ("sft", "dpo", "kto"):
            assert preset["advantage"] is None
            assert preset["policy_loss"] == algo
        else:
            assert preset["advantage"] in ADVANTAGES
        assert preset["policy_loss"] in POLICY_LOSSES or preset["policy_loss"] in OFFLINE_LOSSES
    assert PRESETS["ppo"]["advantage"] == "gae"


def test_policy_objective_hand_values():
    # pg with A = 1: value -1 ; k1 KL = -1 - -2 = 1, times 0.1 ; entropy mean (0.5 + 1.5) / 2 = 1,
    # times 0.01 -> total -1 + 0.1 - 0.01 = -0.91
    # gradient per token: pg -A / 2 = -0.5 ; KL 0.1 * 1 / 2 = 0.05 -> -0.45
    logp = torch.tensor([[-1.0, -1.0]], dtype=torch.float64, requires_grad=True)
    total, metrics = policy_objective(
        logp,
        None,
        torch.tensor([1.0], dtype=torch.float64),
        torch.ones(1, 2),
        ref_logprobs=torch.tensor([[-2.0, -2.0]], dtype=torch.float64),
        entropy=torch.tensor([[0.5, 1.5]], dtype=torch.float64),
        loss_fn=pg,
        kl_fn=k1,
        kl_coef=0.1,
        entropy_coef=0.01,
    )
    total.backward()
    assert total.item() == pytest.approx(-0.91)
    assert torch.allclose(logp.grad, torch.tensor([[-0.45, -0.45]], dtype=torch.float64))
    assert metrics["policy_loss"] == pytest.approx(-1.0)
    assert metrics["kl"] == pytest.approx(1.0)
    assert metrics["entropy"] == pytest.approx(1.0)
    assert metrics["loss"] == pytest.approx(-0.91)


def test_policy_objective_passes_params_and_aggregation():
    logp, old = torch.zeros(1, 2), torch.zeros(1, 2)
    adv, mask = torch.tensor([[1.0, 3.0]]), torch.ones(1, 2)
    # ppo at ratio 1: token losses -1, -3 ; summed over the sequence, over 4 global sequences
    total, _ = policy_objective(
        logp, old, adv, mask,
        loss_fn=POLICY_LOSSES["ppo"], loss_params={"clip_high": 0.28},
        agg_mode="seq-mean-token-sum", global_seqs=4,
    )  # fmt: skip
    assert total.item() == pytest.approx(-1.0)


def test_policy_objective_errors():
    logp, mask = torch.zeros(1, 2), torch.ones(1, 2)
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_objective(logp, logp, logp, mask, loss_fn=pg, kl_fn=k1, kl_coef=0.1)
    with pytest.raises(ValueError, match="entropy"):
        policy_objective(logp, logp, logp, mask, loss_fn=pg, entropy_coef=0.1)
    with pytest.raises(ValueError, match="agg_mode"):
        policy_objective(logp, logp, logp, mask, loss_fn=pg, loss_params={"agg_mode": "token-mean"})
