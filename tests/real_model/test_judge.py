"""SmolLM2-135M-Instruct as a local `judge`: loaded from the converted directory, batched, its answers parsed."""
from __future__ import annotations

import pytest

from streamrft.config import RunConfig
from streamrft.schemas import RolloutGroup, Task, Trajectory
from streamrft.stream_ops.scoring import build_scorer


def make_group(responses: list[str]) -> RolloutGroup:
    task = Task(task_id="t1", prompt="2+2=", answer="4")
    trajs = [Trajectory(traj_id=f"x{i}", group_id="g1", task_id="t1", model_version=0, prompt_ids=[1],
                        response_ids=[2], logprobs=[-0.1], response_text=r) for i, r in enumerate(responses)]
    return RolloutGroup(group_id="g1", task=task, trajectories=trajs)


pytestmark = pytest.mark.real_model


def test_local_judge_with_smollm2(smollm2_dir):
    """SmolLM2-135M-Instruct as a local judge: one batch for a group, each answer parsed, or (where the
    small model's answer holds no score) the fallback, counted."""
    scorer = build_scorer(RunConfig.model_validate({"model": {"path": "unused"}, "stream_ops": {"drop_zero_variance": False, "rewards": [{
        "name": "judge", "fallback": -1.0, "retries": 0, "timeout_s": 300,
        "params": {"model": str(smollm2_dir), "max_new_tokens": 6, "batch_size": 8, "batch_wait_s": 0.5,
                   "template": "Reference: {answer}\nResponse: {response}\n"
                               "Grade the response from 0 to 10. Reply with the number only."}}]}}))
    exp = scorer(make_group(["4", "5", "four"]))
    batcher = scorer.rewards[0].fn.batcher
    assert (batcher.items, batcher.batches) == (3, 1)
    values = exp.reward_components["judge"]
    assert all(v == -1.0 or 0.0 <= v <= 1.0 for v in values)
    assert scorer.stats["fallbacks"] == values.count(-1.0)
    print(f"SmolLM2 judge: {values}")
