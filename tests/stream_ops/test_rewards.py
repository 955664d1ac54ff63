"""Reward functions: hand-derived values, the registry, and the weighted mix."""
from __future__ import annotations

import pytest

from streamrft.stream_ops.rewards import REWARDS, resolve_reward
from streamrft.stream_ops.rewards.exact_match import exact_match
from streamrft.stream_ops.rewards.format import format_reward
from streamrft.stream_ops.rewards.reverse import reverse_reward


def test_exact_match():
    assert exact_match(" 42\n", "42") == 1.0
    assert exact_match("42.0", "42") == 0.0
    assert exact_match("anything", None) == 0.0


def test_reverse_partial_credit():
    assert reverse_reward("dcba", "dcba") == 1.0
    assert reverse_reward(" dcba\n", "dcba") == 1.0
    assert reverse_reward("dcxa", "dcba") == 0.75  # 3 of 4 positions
    assert reverse_reward("dcbaa", "dcba") == 0.8  # 4 right over the longer length 5
    assert reverse_reward("d", "dcba") == 0.25  # a terse answer: 1 of 4
    assert reverse_reward("", "dcba") == 0.0
    assert reverse_reward("abcd", "dcba") == 0.0
    assert reverse_reward("dcba", None) == 0.0


def test_format_regex():
    assert format_reward("<think>a\nb</think> 4", None, pattern=r"^<think>.*</think>") == 1.0
    assert format_reward("4 <think>", None, pattern=r"^<think>.*</think>") == 0.0


def test_math_verify():
    pytest.importorskip("math_verify")
    fn = REWARDS["math_verify"]
    assert fn("so the answer is \\boxed{4}", "4") == 1.0
    assert fn("\\boxed{5}", "4") == 0.0
    assert fn("\\boxed{\\frac{1}{2}}", "0.5") == 1.0
    assert fn("no answer here", "4") == 0.0


def test_weighted_mix():
    weighted_mix = REWARDS["weighted_mix"]  # bound to the registry's lookup
    comps = [{"name": "reverse", "weight": 0.5}, {"name": "exact_match", "weight": 0.5}]
    assert weighted_mix("dcxa", "dcba", components=comps) == pytest.approx(0.375)  # 0.5*0.75 + 0.5*0
    assert weighted_mix("dcba", "dcba", components=comps) == pytest.approx(1.0)
    fmt = [{"name": "format", "weight": 2.0, "params": {"pattern": "^d"}}]
    assert weighted_mix("dcxa", "dcba", components=fmt) == 2.0
    with pytest.raises(ValueError):
        weighted_mix("x", "y", components=[])


def test_registry_and_resolve():
    assert set(REWARDS) == {"exact_match", "math_verify", "format", "reverse", "weighted_mix", "judge", "reward_model",
                            "code_tests"}
    assert resolve_reward("reverse") is reverse_reward
    assert resolve_reward(None, "streamrft.stream_ops.rewards.reverse:reverse_reward") is reverse_reward
    with pytest.raises(ValueError, match="exact_match"):  # the message lists the allowed names
        resolve_reward("nope")
    with pytest.raises(ValueError):
        resolve_reward(None, "no_colon_here")


def test_reward_context_is_the_keyword_parameters_task_and_trajectory():
    from streamrft.stream_ops.rewards import reward_context

    def both(response, answer, *, trajectory, task):
        return 0.0

    def task_only(response, answer, task=None, **params):
        return 0.0

    def kwargs_only(response, answer, **params):  # **kwargs asks for nothing: the plain call
        return 0.0

    def positional_only(response, answer, task, /):
        return 0.0

    assert reward_context(both) == ("task", "trajectory")
    assert reward_context(task_only) == ("task",)
    assert reward_context(kwargs_only) == ()
    assert reward_context(positional_only) == ()
    # every built-in keeps the plain call, but code_tests, which may read its tests from task.metadata
    assert all(reward_context(fn) == () for name, fn in REWARDS.items() if name != "code_tests")
    assert reward_context(REWARDS["code_tests"]) == ("task",)
