"""Pure scoring: hand-computed rewards, weighted mixes, advantages, the zero-variance filter, priority."""
from __future__ import annotations

import math

import pytest

from streamrft.config import RunConfig
from streamrft.schemas import RolloutGroup, Task, Trajectory
from streamrft.stream_ops.rewards import REWARDS, resolve_reward
from streamrft.stream_ops.scoring import ResolvedReward, ScoringError, build_scorer, score_group


def make_group(responses: list[str], answer: str | None = "4", env_rewards: list[float | None] | None = None) -> RolloutGroup:
    task = Task(task_id="t1", prompt="2+2=", answer=answer)
    env_rewards = env_rewards or [None] * len(responses)
    trajs = [Trajectory(traj_id=f"x{i}", group_id="g1", task_id="t1", model_version=0, prompt_ids=[1, 2],
                        response_ids=[3], logprobs=[-0.1], response_text=r, env_reward=e)
             for i, (r, e) in enumerate(zip(responses, env_rewards))]
    return RolloutGroup(group_id="g1", task=task, trajectories=trajs)


def cfg(**sections) -> RunConfig:
    return RunConfig.model_validate({"model": {"path": "unused"}, **sections})


EXACT = ResolvedReward("exact_match", REWARDS["exact_match"])


def grpo_by_hand(rewards):
    mean = sum(rewards) / len(rewards)
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1))
    return [(r - mean) / (std + 1e-6) for r in rewards]


def test_exact_match_rewards_and_grpo_advantages():
    from streamrft.engine.algorithms import ADVANTAGES

    exp = score_group(make_group(["4", "5", " 4\n", "four"]), [EXACT], ADVANTAGES["grpo"], {}, True, "reward_std")
    assert exp.rewards == [1.0, 0.0, 1.0, 0.0]
    assert exp.reward_components == {"exact_match": [1.0, 0.0, 1.0, 0.0]}
    # mean 0.5, sample std sqrt(4 * 0.25 / 3) = 0.57735 -> +-0.5 / 0.57735 = +-0.86603
    assert exp.advantages == pytest.approx([0.866025, -0.866025, 0.866025, -0.866025], abs=1e-5)
    assert exp.priority == pytest.approx(0.5)  # population std of [1, 0, 1, 0]
    assert [t.traj_id for t in exp.trajectories] == ["x0", "x1", "x2", "x3"]
    assert (exp.group_id, exp.task.task_id) == ("g1", "t1")


def test_weighted_mix_keeps_each_component():
    terms = [ResolvedReward("exact_match", REWARDS["exact_match"], weight=0.5),
             ResolvedReward("format", REWARDS["format"], weight=2.0, params={"pattern": r"^\d"})]
    exp = score_group(make_group(["4", "5", "x4"]), terms, None, {}, False, "fifo")
    assert exp.reward_components == {"exact_match": [1.0, 0.0, 0.0], "format": [1.0, 1.0, 0.0]}
    assert exp.rewards == [2.5, 2.0, 0.0]  # 0.5 * em + 2.0 * format
    assert exp.advantages == [0.0, 0.0, 0.0]  # no group advantage: the trainer computes it
    assert exp.priority == 0.0


def test_env_term_reads_env_reward_and_mixes():
    from streamrft.engine.algorithms import ADVANTAGES

    terms = [ResolvedReward("env", None, weight=1.0), EXACT]
    exp = score_group(make_group(["4", "5", "4"], env_rewards=[0.5, 2.0, -1.0]), terms, ADVANTAGES["grpo"], {},
                      True, "abs_advantage")
    assert exp.reward_components["env"] == [0.5, 2.0, -1.0]
    assert exp.rewards == [1.5, 2.0, 0.0]
    assert exp.advantages == pytest.approx(grpo_by_hand([1.5, 2.0, 0.0]), abs=1e-5)
    assert exp.priority == pytest.approx(sum(abs(a) for a in exp.advantages) / 3)


def test_env_term_without_env_reward_is_an_error():
    with pytest.raises(ScoringError, match="x1 has no env_reward"):
        score_group(make_group(["4", "5"], env_rewards=[1.0, None]), [ResolvedReward("env", None)], None, {}, False, "fifo")


def test_zero_variance_is_filtered_only_when_asked():
    from streamrft.engine.algorithms import ADVANTAGES

    group = make_group(["4", "4", "4"])
    assert score_group(group, [EXACT], ADVANTAGES["grpo"], {}, True, "reward_std") is None
    kept = score_group(group, [EXACT], ADVANTAGES["grpo"], {}, False, "reward_std")
    assert kept.rewards == [1.0, 1.0, 1.0] and kept.advantages == [0.0, 0.0, 0.0] and kept.priority == 0.0


def test_failing_reward_raises_scoring_error_naming_term_and_trajectory():
    def judge(response, answer, **params):
        if response == "5":
            raise ZeroDivisionError("judge broke")
        return 1.0

    with pytest.raises(ScoringError) as info:
        score_group(make_group(["4", "5"]), [ResolvedReward("judge", judge)], None, {}, False, "fifo")
    assert info.value.error_type == "ZeroDivisionError"
    assert "'judge'" in info.value.reason and "x1" in info.value.reason and "judge broke" in info.value.reason


def test_failing_reward_becomes_a_dead_letter_and_good_groups_still_score():
    from streamrft.schemas import decode, encode
    from streamrft.stream_ops.app import route_record

    def judge(response, answer, **params):
        return 1 / len(response)  # an empty response breaks this user's reward

    def scorer(group):
        return score_group(group, [ResolvedReward("judge", judge)], None, {}, False, "fifo")

    raw = encode(make_group(["4", ""]))
    out = route_record(scorer, "ns", raw, b"g1", "ns.rollouts.default", 2, 17)
    dead = decode(out.value)
    assert out.kind == "dead_letter" and out.key == b"g1" and dead.kind == "dead_letter"
    assert dead.error_type == "ZeroDivisionError" and "'judge' raised on trajectory x1" in dead.reason
    assert (dead.source_topic, dead.source_partition, dead.source_offset, dead.value) == ("ns.rollouts.default", 2, 17, raw)
    out = route_record(scorer, "ns", encode(make_group(["4", "12"])), b"g1", "ns.rollouts.default", 2, 18)
    exp = decode(out.value)
    assert out.kind == "experience" and exp.rewards == [1.0, 0.5] and exp.source_offset == 18


def test_a_group_never_trained_is_announced_to_admission_control_and_an_experience_is_not():
    """Filtered and dead-lettered groups yield a GroupDropped record for the admission topic, named
    by the group's id (the record's key), so explorers' admission control stops counting them."""
    from streamrft.engine.algorithms import ADVANTAGES
    from streamrft.schemas import decode, encode
    from streamrft.stream_ops.app import route_record

    def scorer(group):
        return score_group(group, [EXACT], ADVANTAGES["grpo"], {}, True, "reward_std")

    group = make_group(["4", "4"])
    out = route_record(scorer, "ns", encode(group), group.group_id.encode(), "ns.rollouts.default", 0, 5)
    drop = decode(out.dropped[1])
    assert out.kind == "filtered" and out.value is None and out.dropped[0] == group.group_id.encode()
    assert (drop.kind, drop.group_id, drop.reason, drop.role) == ("group_dropped", group.group_id, "filtered",
                                                                  "stream_ops")
    out = route_record(scorer, "ns", b"not msgpack", b"g7", "ns.rollouts.default", 1, 9)
    assert out.kind == "dead_letter" and decode(out.dropped[1]).group_id == "g7"
    assert decode(out.dropped[1]).reason == "dead_letter"
    out = route_record(scorer, "ns", encode(make_group(["4", "12"])), b"g1", "ns.rollouts.default", 2, 18)
    assert out.kind == "experience" and out.dropped is None


def test_every_scored_group_yields_its_task_outcome_filtered_ones_too_and_a_dead_letter_none():
    """The task-stats record (explorers' task selection) carries one reward per episode: an
    all-solved group, which stream ops filter, is exactly what the difficulty selector needs."""
    from streamrft.schemas import TaskOutcome, decode, encode
    from streamrft.stream_ops.app import route_record

    scorer = build_scorer(cfg(stream_ops={"rewards": [{"name": "exact_match"}]}), with_rewards=True)
    group = make_group(["4", " 4", "4"])
    out = route_record(scorer, "ns", encode(group), b"g1", "ns.rollouts.default", 0, 3)
    stat = decode(out.stats[1], TaskOutcome)
    assert out.kind == "filtered" and out.stats[0] == b"g1"
    assert (stat.group_id, stat.task_id, stat.rewards, stat.model_version) == ("g1", "t1", [1.0, 1.0, 1.0], 0)
    out = route_record(scorer, "ns", encode(make_group(["4", "5"])), b"g1", "ns.rollouts.default", 0, 4)
    assert out.kind == "experience" and decode(out.stats[1]).rewards == [1.0, 0.0]
    assert route_record(scorer, "ns", b"junk", b"g2", "ns.rollouts.default", 0, 5).stats is None
    # the plain scorer (what other callers use) is unchanged: an experience or None
    assert build_scorer(cfg())(group) is None


def test_non_finite_reward_is_an_error():
    with pytest.raises(ScoringError, match="returned nan"):
        score_group(make_group(["4"]), [ResolvedReward("nan", lambda r, a: float("nan"))], None, {}, False, "fifo")


def test_build_scorer_uses_preset_advantage_and_config():
    scorer = build_scorer(cfg(stream_ops={"priority": "abs_advantage"}))  # grpo preset, exact_match
    exp = scorer(make_group(["4", "5", "4", "4"]))
    assert exp.advantages == pytest.approx(grpo_by_hand([1.0, 0.0, 1.0, 1.0]), abs=1e-5)
    assert exp.priority == pytest.approx(0.75, abs=1e-5)  # (0.5 * 3 + 1.5) / 4
    assert scorer(make_group(["5", "5"])) is None  # dropped by default


def test_build_scorer_rloo_import_path_and_repeated_names():
    c = cfg(algorithm={"advantage": {"type": "rloo"}},
            stream_ops={"rewards": [{"name": "exact_match"}, {"name": "exact_match", "weight": 2.0},
                                    {"import_path": "operator:eq", "weight": 0.0}]})
    exp = build_scorer(c)(make_group(["4", "5", " 4"]))
    assert set(exp.reward_components) == {"exact_match", "exact_match#2", "operator:eq"}
    assert exp.reward_components["operator:eq"] == [1.0, 0.0, 0.0]  # no strip: " 4" != "4"
    assert exp.rewards == [3.0, 0.0, 3.0]
    # leave-one-out: r_i - mean of the others
    assert exp.advantages == pytest.approx([3.0 - 1.5, 0.0 - 3.0, 3.0 - 1.5])


def test_build_scorer_batch_level_advantage_sends_zeros_and_keeps_zero_variance():
    scorer = build_scorer(cfg(algorithm={"type": "ppo"}))  # gae: the trainer computes advantages
    exp = scorer(make_group(["4"]))
    assert exp.rewards == [1.0] and exp.advantages == [0.0]


def test_unknown_reward_is_rejected_at_config_load_and_by_the_registry():
    with pytest.raises(ValueError, match=r"stream_ops.rewards.0.name"):
        cfg(stream_ops={"rewards": [{"name": "nope"}]})
    with pytest.raises(ValueError, match="unknown reward 'nope'"):
        resolve_reward("nope")


def step_group(steps: list[tuple[str, float]]) -> RolloutGroup:
    """A step_wise group: (episode_id, env_reward) per step, in order."""
    task = Task(task_id="t1", prompt="guess", answer=None)
    trajs = [Trajectory(traj_id=f"s{i}", group_id="g1", task_id="t1", model_version=0, prompt_ids=[1, 2],
                        response_ids=[3], logprobs=[-0.1], response_text="", env_reward=r,
                        info={"episode_id": e, "step": sum(1 for p, _ in steps[:i] if p == e)})
             for i, (e, r) in enumerate(steps)]
    return RolloutGroup(group_id="g1", task=task, trajectories=trajs)


ENV = ResolvedReward("env", None)


def test_step_wise_advantages_are_per_episode_and_broadcast_to_steps():
    from streamrft.engine.algorithms import ADVANTAGES

    # episode a (3 steps) reward 1, b (1 step) 0, c (2 steps) 0.
    # per episode: mean 1/3, sample std sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = sqrt(1/3) ->
    # A_a = (2/3) / sqrt(1/3) = 2/sqrt(3), A_b = A_c = -(1/3) / sqrt(1/3) = -1/sqrt(3).
    # (per step it would be mean 1/2 over 6 steps: a's 3 steps would set the baseline)
    group = step_group([("a", 1.0), ("a", 1.0), ("b", 0.0), ("a", 1.0), ("c", 0.0), ("c", 0.0)])
    exp = score_group(group, [ENV], ADVANTAGES["grpo"], {"eps": 0.0}, True, "abs_advantage")
    up, down = 2 / math.sqrt(3), -1 / math.sqrt(3)
    assert exp.rewards == [1.0, 1.0, 0.0, 1.0, 0.0, 0.0]
    assert exp.advantages == pytest.approx([up, up, down, up, down, down], abs=1e-6)  # grpo runs in float32
    assert exp.priority == pytest.approx((abs(up) + 2 * abs(down)) / 3, abs=1e-6)  # over episodes, not steps


def test_step_wise_zero_variance_filter_looks_at_episodes():
    from streamrft.engine.algorithms import ADVANTAGES

    same = step_group([("a", 1.0), ("a", 1.0), ("b", 1.0)])
    assert score_group(same, [ENV], ADVANTAGES["grpo"], {}, True, "fifo") is None


def test_steps_of_one_episode_that_score_differently_are_a_scoring_error():
    from streamrft.engine.algorithms import ADVANTAGES

    with pytest.raises(ScoringError, match="episode a"):
        score_group(step_group([("a", 1.0), ("a", 0.0), ("b", 0.0)]), [ENV], ADVANTAGES["grpo"], {}, False, "fifo")


def test_a_group_with_episode_ids_on_some_trajectories_only_is_a_scoring_error():
    from streamrft.engine.algorithms import ADVANTAGES

    group = step_group([("a", 1.0), ("b", 0.0)])
    group.trajectories[1].info = {}
    with pytest.raises(ScoringError, match="episode_id"):
        score_group(group, [ENV], ADVANTAGES["grpo"], {}, False, "fifo")


EPISODE_REWARD = '''
def bonus(response, answer, *, task, trajectory, scale=1.0):
    return scale * trajectory.env_reward * task.metadata["bonus"] + len(response)
'''


def test_a_user_reward_that_asks_for_task_and_trajectory_gets_them(tmp_path, monkeypatch):
    (tmp_path / "my_episode_reward.py").write_text(EPISODE_REWARD)
    monkeypatch.syspath_prepend(str(tmp_path))
    c = cfg(algorithm={"advantage": {"type": "dr_grpo"}},
            stream_ops={"rewards": [{"import_path": "my_episode_reward:bonus", "params": {"scale": 2.0}},
                                    {"name": "exact_match"}]})
    group = make_group(["4", "55"], env_rewards=[1.0, 0.5])
    group.task.metadata = {"bonus": 3.0}
    exp = build_scorer(c)(group)
    # 2 * env_reward * 3 + len(response): 2*1*3 + 1 = 7, 2*0.5*3 + 2 = 5; exact_match 1, 0
    assert exp.reward_components["my_episode_reward:bonus"] == [7.0, 5.0]
    assert exp.rewards == [8.0, 5.0]
    assert exp.advantages == pytest.approx([1.5, -1.5])


def test_broker_outages_are_told_from_the_workers_own_failures():
    from aiokafka.errors import (KafkaConnectionError, KafkaTimeoutError, NodeNotReadyError, RecordTooLargeError,
                                 TopicAuthorizationFailedError, UnknownError)

    from streamrft.stream_ops.app import is_broker_outage

    for exc in (KafkaTimeoutError(), UnknownError(), KafkaConnectionError(), NodeNotReadyError(), ConnectionResetError()):
        assert is_broker_outage(exc), exc
    for exc in (RecordTooLargeError(), TopicAuthorizationFailedError(), ValueError(), None):
        assert not is_broker_outage(exc), exc


def test_the_feedback_term_takes_the_joins_values_by_trajectory_mixed_with_the_others():
    """`feedback`: one value a trajectory (by traj_id, in any order) from the feedback join, weighted
    in the mix like any term; on a timeout with `fallback`, another term's values stand in."""
    scorer = build_scorer(cfg(stream_ops={"rewards": [
        {"name": "feedback", "weight": 0.5, "params": {"on_timeout": "fallback", "fallback_term": "exact_match"}},
        {"name": "exact_match", "weight": 2.0}], "drop_zero_variance": False}, eval={"rewards": [{"name": "exact_match"}]}))
    assert scorer.parks
    group = make_group(["4", "5", "4"])
    exp = scorer(group, {"x2": 0.2, "x0": 1.0, "x1": 0.6})
    assert exp.reward_components == {"feedback": [1.0, 0.6, 0.2], "exact_match": [1.0, 0.0, 1.0]}
    assert exp.rewards == pytest.approx([0.5 * 1.0 + 2.0, 0.5 * 0.6, 0.5 * 0.2 + 2.0])
    fallback = scorer(group, "exact_match")  # no ratings in time: exact_match in feedback's place
    assert fallback.reward_components["feedback"] == [1.0, 0.0, 1.0]
    assert fallback.rewards == pytest.approx([2.5, 0.0, 2.5])
    with pytest.raises(ScoringError, match="no rating for trajectory x1"):
        scorer(group, {"x0": 1.0, "x2": 0.0})
    with pytest.raises(ScoringError, match="came without its ratings"):
        scorer(group)
    assert not build_scorer(cfg()).parks
