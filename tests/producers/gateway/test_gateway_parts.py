"""The gateway's pure parts with hand-built inputs: assembly of an episode's calls, prompt reuse,
stop strings, team keys."""
from __future__ import annotations

import pytest

from streamrft.config import GatewayTeam
from streamrft.engine.models import build_char_tokenizer
from streamrft.engine.rollout.base import Completion
from streamrft.producers.gateway.episodes import Call, Finish, build_group, extends, trajectories
from streamrft.producers.gateway.prompts import LastCall, PromptBuilder, PromptError, apply_stop
from streamrft.producers.gateway.teams import TeamKeys, digest
from streamrft.producers.gateway.worker import cut
from streamrft.schemas import RolloutGroup, decode, encode

TOK = build_char_tokenizer("abcdefgh:0123456789 ")
EOS = TOK.eos_token_id
COMMON = {"group_id": "g", "task_id": "t", "team": "agents"}


def _ids(text: str, bos: bool = False) -> list[int]:
    return TOK(text, add_special_tokens=bos)["input_ids"]


def test_calls_that_extend_each_other_make_one_masked_trajectory():
    p1 = _ids("ab:", bos=True)
    c1 = Call(p1, _ids("1") + [EOS], [-0.5, -0.25], version=3, finish_reason="stop")
    p2 = p1 + c1.ids + _ids("hi:")
    c2 = Call(p2, _ids("2"), [-1.5], version=4, finish_reason="length")
    assert extends([c1, c2])
    (t,) = trajectories("e", [c1, c2], Finish(reward=1.0, step_rewards=None), TOK, **COMMON)
    assert t.prompt_ids == p1
    assert t.response_ids == _ids("1") + [EOS] + _ids("hi:") + _ids("2")
    assert t.loss_mask == [1, 1, 0, 0, 0, 1]
    assert t.logprobs == [-0.5, -0.25, 0.0, 0.0, 0.0, -1.5]
    assert t.model_version == 3 and t.info["versions"] == [3, 4]  # the oldest: the staleness rule's
    assert t.env_reward == 1.0 and t.info["step_rewards"] == [0.0, 1.0] and t.finish_reason == "length"


def test_calls_that_do_not_extend_are_steps_with_the_episode_reward():
    c1 = Call(_ids("ab:", True), _ids("1"), [-0.5], 0, "stop")
    c2 = Call(_ids("zz", True), _ids("2"), [-0.7], 1, "stop")  # history rewritten: not an extension
    assert not extends([c1, c2])
    steps = trajectories("e", [c1, c2], Finish(reward=0.75, step_rewards=[0.25, 0.5], finish_reason="max_turns"),
                         TOK, **COMMON)
    assert [s.prompt_ids for s in steps] == [c1.prompt_ids, c2.prompt_ids]
    assert [s.model_version for s in steps] == [0, 1] and [s.info["step_reward"] for s in steps] == [0.25, 0.5]
    assert all(s.env_reward == 0.75 and s.loss_mask is None for s in steps)
    assert [s.finish_reason for s in steps] == ["stop", "max_turns"]


def test_a_group_passes_the_wire_contract():
    c = Call(_ids("ab:", True), _ids("1"), [0.00001], 0, "stop")  # rounding above 0 is clamped
    group = build_group("g", "agents", [("e1", [c], Finish(1.0, None, task_id="t", metadata={"k": [1]})),
                                        ("e2", [c], Finish(0.0, None, task_id="t"))], TOK, "gateway-x")
    back = decode(encode(group), RolloutGroup)
    assert back.task.task_id == "t" and [t.logprobs for t in back.trajectories] == [[0.0], [0.0]]
    assert back.trajectories[0].info["metadata"] == {"k": [1]}


def test_a_continued_text_prompt_reuses_the_sampled_ids():
    pb = PromptBuilder(TOK)
    first, text, _ = pb.completion_prompt("ab:", None)
    last = LastCall(first, _ids("1") + [EOS], "1", True, prompt_text=text)
    ids, _, _ = pb.completion_prompt("ab:1hi:", last)
    assert ids == first + _ids("1") + [EOS] + _ids("hi:")  # the model's EOS stays, as sampled
    assert pb.completion_prompt("ab:2hi:", last)[0] == _ids("ab:2hi:", True)  # not a continuation: fresh
    assert pb.completion_prompt([5, 6, 7], last)[0] == [5, 6, 7]
    assert pb.completion_prompt(["ab:"], None)[0] == first
    for bad in ("", [], [len(TOK)], [True], 3):
        with pytest.raises(PromptError):
            pb.completion_prompt(bad, None)
    with pytest.raises(PromptError, match="no chat template"):
        pb.chat_prompt([{"role": "user", "content": "hi"}], None)


def test_a_stop_string_cuts_after_the_token_that_completes_it():
    ids = _ids("12:34")
    out_ids, lps, text, hit, _ = apply_stop(TOK, ids, [-1.0] * 5, [":3", "9"])
    assert (out_ids, lps, text, hit) == (_ids("12:3"), [-1.0] * 4, "12", True)
    assert apply_stop(TOK, ids, [-1.0] * 5, ["x"])[2:4] == ("12:34", False)
    c = Completion(ids, [-1.0] * 5, "12:34", "stop", [[(1, -0.1)]] * 5)
    short = cut(TOK, c, 2)
    assert short.token_ids == ids[:2] and short.finish_reason == "length" and short.text == "12"
    assert len(short.top_logprobs) == 2 and cut(TOK, c, 5) is c


def test_keys_decide_the_team_and_are_kept_as_digests():
    keys = TeamKeys([GatewayTeam(name="a", key_env="KEY_A"), GatewayTeam(name="b", key_sha256=digest("kb"))],
                    environ={"KEY_A": "ka"})
    assert keys.team_of("Bearer ka") == "a" and keys.team_of("Bearer kb") == "b"
    assert keys.team_of("Bearer kc") is None and keys.team_of(None) is None and keys.team_of("ka") is None
    assert "ka" not in repr(keys.__dict__)
    with pytest.raises(ValueError, match="KEY_A is not set"):
        TeamKeys([GatewayTeam(name="a", key_env="KEY_A")], environ={})
    with pytest.raises(ValueError, match="same key"):
        TeamKeys([GatewayTeam(name="a", key_env="K"), GatewayTeam(name="b", key_sha256=digest("k"))], environ={"K": "k"})


def test_a_served_users_short_rating_is_the_feedback_it_stands_for():
    from streamrft.producers.gateway.feedback import parse_feedback
    from streamrft.producers.gateway.groups import GatewayError

    (f,) = parse_feedback({"completion_id": "cmpl-1-0", "rating": 1})
    assert (f.target, f.target_id, f.reward, f.source, f.rater) == ("completion", "cmpl-1-0", 1.0, "user", "user")
    (g,) = parse_feedback({"feedback": [{"completion_id": "c", "rating": 0.5, "rater": "u7", "comment": "ok"}]})
    assert (g.rater, g.comment) == ("u7", "ok")
    for body, param in (({"completion_id": "c", "rating": True}, "rating"),
                        ({"completion_id": "c", "rating": 1, "label": "x"}, "label"),
                        ({"feedback": [{"completion_id": "c"}]}, "feedback[0].rating")):
        with pytest.raises(GatewayError) as e:
            parse_feedback(body)
        assert e.value.status == 400 and e.value.param == param
