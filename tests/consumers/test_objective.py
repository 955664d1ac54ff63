"""The trainer's Objective, resolved from a RunConfig alone (no Kafka): Dr.GRPO's length normaliser."""
import pytest

from streamrft.config import RunConfig
from streamrft.consumers.update import Objective


def objective(workflow="single_turn", **explorer) -> Objective:
    ex = {"workflow": workflow, "sampling": {"max_new_tokens": 6}, **explorer}
    if workflow != "single_turn" or "workflow_import_path" in explorer:
        ex["env"] = {"type": "guess_number"}
    return Objective(RunConfig.model_validate({"model": {"path": "unused"}, "algorithm": {"type": "dr_grpo"},
                                               "explorer": ex}))


@pytest.mark.parametrize("workflow", ["single_turn", "step_wise"])
def test_dr_grpo_norm_len_is_max_new_tokens_when_a_trajectory_is_one_turn(workflow):
    obj = objective(workflow, max_turns=4, max_total_tokens=100)
    assert obj.agg_mode == "seq-mean-token-sum-norm"
    assert obj.norm_len == 6


def test_dr_grpo_norm_len_is_the_episode_budget_for_multi_turn():
    assert objective("multi_turn", max_turns=4, max_total_tokens=100).norm_len == 24  # 4 turns x 6 tokens
    assert objective("multi_turn", max_turns=4, max_total_tokens=20).norm_len == 20  # the episode's total cap
    assert objective(workflow_import_path="pkg.mod:flow", max_turns=3, max_total_tokens=100).norm_len == 18
