"""The replay buffer's maths with hand-derived values (priorities -> probabilities, importance
weights, beta annealing), the priority sources, and the buffer's reuse, staleness and capacity rules."""
from __future__ import annotations

import pytest
import torch

from streamrft.config import ReplayBufferConfig
from streamrft.consumers.replay_buffer import (ReplayBuffer, abs_advantage, annealed_beta, importance_weights,
                                               probabilities, reward_std, td_error)
from streamrft.engine.algorithms.objective import scale_gradient
from streamrft.schemas import ExperienceGroup, Task, Trajectory


def test_probabilities_follow_priority_to_the_alpha():
    assert probabilities([1.0, 3.0], alpha=1.0, epsilon=0.0) == pytest.approx([0.25, 0.75])
    assert probabilities([1.0, 4.0], alpha=0.5, epsilon=0.0) == pytest.approx([1 / 3, 2 / 3])  # sqrt: 1, 2
    assert probabilities([0.0, 5.0], alpha=0.0, epsilon=1e-3) == pytest.approx([0.5, 0.5])  # alpha 0: uniform
    assert probabilities([0.0, 1.0], alpha=1.0, epsilon=1.0) == pytest.approx([1 / 3, 2 / 3])  # epsilon added first


def test_importance_weights_are_normalised_by_the_largest():
    # N = 2: (2 * 0.25)^-1 = 2, (2 * 0.75)^-1 = 2/3; the largest any entry gets is 2
    assert importance_weights([0.25, 0.75], [0, 1], beta=1.0) == pytest.approx([1.0, 1 / 3])
    assert importance_weights([0.25, 0.75], [1], beta=0.5) == pytest.approx([(1 / 3) ** 0.5])
    assert importance_weights([0.25, 0.75], [0, 1], beta=0.0) == pytest.approx([1.0, 1.0])


def test_beta_anneals_linearly_then_stays():
    assert annealed_beta(0.4, 1.0, 10, 0) == pytest.approx(0.4)
    assert annealed_beta(0.4, 1.0, 10, 5) == pytest.approx(0.7)
    assert annealed_beta(0.4, 1.0, 10, 25) == pytest.approx(1.0)
    assert annealed_beta(0.4, 1.0, 0, 25) == pytest.approx(0.4)  # no annealing


def test_priority_sources():
    assert abs_advantage([1.0, -1.0, 0.5, -0.5]) == pytest.approx(0.75)
    assert reward_std([1.0, 0.0, 1.0, 0.0]) == pytest.approx(0.5)
    assert reward_std([0.3, 0.3]) == 0.0
    assert td_error([0.2, 0.4]) == pytest.approx(0.3)


def test_scale_gradient_keeps_values_and_scales_each_rows_gradient():
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    y = scale_gradient(x, torch.tensor([[0.5], [2.0]]))
    assert torch.equal(y, x.detach())
    y.sum().backward()
    assert torch.equal(x.grad, torch.tensor([[0.5, 0.5], [2.0, 2.0]]))


def _group(gid: str, version: int, advantages: list[float]) -> ExperienceGroup:
    task = Task(prompt="rev ab=", answer="ba")
    trajs = [Trajectory(traj_id=f"{gid}-{i}", group_id=gid, task_id=task.task_id, model_version=version,
                        prompt_ids=[1, 2], response_ids=[3], logprobs=[-0.5]) for i in range(len(advantages))]
    return ExperienceGroup(group_id=gid, task=task, trajectories=trajs, rewards=[0.0] * len(advantages),
                           advantages=advantages)


def test_buffer_counts_reuse_evicts_by_reuse_staleness_and_capacity():
    cfg = ReplayBufferConfig(capacity=3, replay_groups=1, max_reuse=2, max_staleness=2, alpha=1.0, beta=1.0)
    buf = ReplayBuffer(cfg, seed=0)
    buf.add("t", 0, 0, _group("A", 0, [1.0, -1.0]), [0, 1])
    buf.add("t", 0, 1, _group("B", 1, [0.0, 0.0]), [0, 1])
    buf.add("t", 0, 2, _group("C", 1, [2.0, -2.0]), [1])
    buf.add("t", 0, 3, _group("D", 2, [3.0, -3.0]), [0, 1])  # over capacity: A, the oldest, leaves
    assert [e.group.group_id for e in buf.entries] == ["B", "C", "D"]
    assert [m["offset"] for m in buf.members()] == [1, 2, 3] and buf.members()[1]["keep"] == [1]
    drawn = [e.group.group_id for _ in range(2) for e, _ in buf.sample(trainer_version=2, step=_)]
    assert all(g in "BCD" for g in drawn)
    buf.evict_stale(trainer_version=4)  # older than 4 - 2: B and C (version 1) leave
    assert [e.group.group_id for e in buf.entries if e.reuse < 2] in (["D"], [])
    # the same buffer and step draw the same; reuse counted; max_reuse removes
    a, b = ReplayBuffer(cfg, 0), ReplayBuffer(cfg, 0)
    for x in (a, b):
        x.add("t", 0, 0, _group("E", 5, [1.0, -1.0]), [0, 1])
        x.add("t", 0, 1, _group("F", 5, [0.0, 0.0]), [0, 1])
    assert [e.offset for e, _ in a.sample(5, 7)] == [e.offset for e, _ in b.sample(5, 7)]
    uses = [(e.offset, e.reuse) for step in (8, 9, 10, 11) for e, _ in a.sample(5, step)]  # reuse as drawn
    assert len(uses) == 3 and len(a) == 0  # 2 entries x 2 reuses, one used by step 7 already
    assert sorted(r for _, r in uses) == [1, 2, 2] and sorted(o for o, _ in uses).count(0) in (1, 2)


def test_buffer_restore_reads_members_back_and_skips_what_the_log_lost():
    cfg = ReplayBufferConfig(capacity=4, replay_groups=1)
    buf = ReplayBuffer(cfg, seed=0)
    g, h = _group("G", 0, [1.0, -1.0]), _group("H", 0, [1.0, -1.0])
    buf.add("t", 0, 5, g, [0, 1])
    buf.add("t", 1, 9, h, [1])
    buf.entries[0].reuse = 1
    members = buf.members()
    again = ReplayBuffer(cfg, seed=0)
    again.restore(members, lambda locs: {("t", 0, 5): g} if locs == [("t", 0, 5), ("t", 1, 9)] else {})
    assert [(e.group.group_id, e.reuse, e.keep) for e in again.entries] == [("G", 1, [0, 1])]
