"""The reversal judge's lessons (`producers.judge_data`): labels from the rule, prompts in its vocabulary."""
from __future__ import annotations

from pathlib import Path

from streamrft.config import load_config
from streamrft.launch.prepare import _stage_pairs
from streamrft.producers.judge_data import (JUDGE_ALPHABET, JUDGE_MAX_NEW_TOKENS, JUDGE_TEMPLATE, judge_answer,
                                          judge_score, make_judge_pairs)

ROOT = Path(__file__).resolve().parents[2]


def test_the_label_is_the_rules_partial_credit_on_nine():
    # reverse_reward: 1.0 exact; 3 of 4 positions -> 0.75 -> 6.75 -> 7; 4 of 5 (one extra) -> 0.8 -> 7.2 -> 7;
    # nothing in common -> 0; an empty answer -> 0
    assert [judge_score("dcba", "dcba"), judge_score("dcxa", "dcba"), judge_score("dcbaa", "dcba"),
            judge_score("abcd", "dcba"), judge_score("", "dcba")] == [9, 7, 7, 0, 0]


def test_the_judge_marks_each_position_then_scores():
    # "dcxa" vs "dcba": positions 0, 1, 3 agree -> "++-+", 3/4 -> 7; one extra letter -> "++++-", 4/5 -> 7;
    # cut short -> the missing positions are wrong; surrounding whitespace is ignored, as the rule does
    assert judge_answer("dcxa", "dcba") == " ++-+ Score: 7"
    assert judge_answer("dcbaa", "dcba") == " ++++- Score: 7"
    assert judge_answer("dc", "dcba") == " ++-- Score: 4"
    assert judge_answer(" dcba\n", "dcba") == " ++++ Score: 9"
    assert judge_answer("", "dcb") == " --- Score: 0"


def test_pairs_fill_the_template_and_stay_in_the_judges_vocabulary():
    pairs = make_judge_pairs(300, seed=4)
    assert len(pairs) == 300 and pairs == make_judge_pairs(300, seed=4)
    for prompt, reply in pairs:
        assert prompt.startswith("Expected: ") and prompt.endswith("\nMarks:")
        expected, got = prompt.split("\n")[0][len("Expected: "):], prompt.split("\n")[1][len("Got: "):]
        assert reply == judge_answer(got, expected) and reply.endswith(f" Score: {judge_score(got, expected)}")
        assert set(prompt + reply) <= set(JUDGE_ALPHABET) and len(reply) <= JUDGE_MAX_NEW_TOKENS
    # every grade is taught, the exact answers and the all-wrong ones most
    digits = [reply[-1] for _, reply in pairs]
    assert set(digits) >= {"0", "4", "9"} and digits.count("9") > 40


def test_the_judge_model_example_trains_on_these_pairs():
    cfg = load_config(ROOT / "examples" / "judge_model_cpu.yaml")
    (stage,) = cfg.stages
    assert set(cfg.model.build.alphabet) == set(JUDGE_ALPHABET)
    pairs = _stage_pairs(stage, cfg)
    assert len(pairs) == stage.data["size"] and pairs[:5] == make_judge_pairs(stage.data["size"], seed=11)[:5]
    judge_cfg = load_config(ROOT / "examples" / "judge_cpu.yaml")
    assert judge_cfg.stream_ops.rewards[0].params["template"] == JUDGE_TEMPLATE
    assert judge_cfg.stream_ops.rewards[0].params["model"] == f"{cfg.output_dir}/stage-0-sft"
    assert judge_cfg.stream_ops.rewards[0].params["max_new_tokens"] == JUDGE_MAX_NEW_TOKENS
