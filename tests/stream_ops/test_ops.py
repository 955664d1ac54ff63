"""Data cleaning ops (streamrft.stream_ops.ops), each with hand-computed values, and the pipeline:
drops keep the rest of the group, a group left with fewer than 2 is filtered, a rejection dead-letters."""
from __future__ import annotations

import pytest

from streamrft.config import ConfigError, RunConfig
from streamrft.config.base import CLEANING_OP_TYPES
from streamrft.schemas import RolloutGroup, Task, Trajectory
from streamrft.stream_ops.app import route_record
from streamrft.stream_ops.ops import OPS, Cleaning, RecordRejected, build_cleaning
from streamrft.stream_ops.ops import charset, dedup, length, prompt_copy, repetition
from streamrft.schemas import decode, encode

LONG = "the quick brown fox jumps over the lazy dog near the river bank today"


def group(responses: list[str], prompt: str = "Tell me a story.", answer: str | None = "4", gid: str = "g",
          tokens: list[int] | None = None) -> RolloutGroup:
    task = Task(task_id=f"t-{gid}", prompt=prompt, answer=answer)
    trajs = [Trajectory(traj_id=f"{gid}-{i}", group_id=gid, task_id=task.task_id, team="default", model_version=0,
                        prompt_ids=[1], response_ids=[5] * (tokens[i] if tokens else 1),
                        logprobs=[-0.1] * (tokens[i] if tokens else 1), response_text=r)
             for i, r in enumerate(responses)]
    return RolloutGroup(group_id=gid, team="default", task=task, trajectories=trajs)


def test_registry_matches_config_names():
    assert sorted(OPS) == sorted(CLEANING_OP_TYPES)


def test_length_bounds():
    op = length.make(min_chars=2, max_chars=5, max_tokens=3)
    g = group(["a", "abcd", "abcdef", "abc"], tokens=[1, 1, 1, 4])
    assert op(g) == {0: "1 chars < min_chars 2", 2: "6 chars > max_chars 5", 3: "4 tokens > max_tokens 3"}
    with pytest.raises(ValueError, match="max_chars=-1"):
        length.make(max_chars=-1)


def test_repetition_ratio_by_hand():
    assert repetition.repeat_ratio("a b c a b c a b c", 3) == pytest.approx(4 / 7)  # 7 trigrams, 3 distinct
    assert repetition.repeat_ratio("a b", 3) == 0.0 and repetition.repeat_ratio("a b c d", 2) == 0.0
    op = repetition.make(n=3, max_ratio=0.5)
    assert op(group(["a b c a b c a b c", "a b c d e f"])) == {0: "3-gram repeat ratio 0.571 > 0.5"}


def test_charset_nonprintable_and_script():
    assert charset.nonprintable_fraction("ab\x00\x01\n") == pytest.approx(2 / 5)  # newline is allowed
    assert charset.foreign_fraction("abc Дд 12", {"LATIN"}) == pytest.approx(2 / 5)  # digits are not letters
    op = charset.make(max_nonprintable=0.1, scripts=["latin"], max_foreign=0.3)
    assert op(group(["fine text", "bad\x00\x00", "abc Дд", "Привет мир"])) == {
        1: "non-printable fraction 0.400 > 0.1", 2: "letters outside ['LATIN']: 0.400 > 0.3",
        3: "letters outside ['LATIN']: 1.000 > 0.3"}


def test_dedup_exact_near_across_groups_and_redelivery():
    op = dedup.make(threshold=0.5, min_words=4)
    near = LONG.replace("today", "tonight")  # 13 of 14 trigrams shared: Jaccard 12/14
    first = [LONG, "  " + LONG.upper() + " ", near, "4", "4", "a completely different answer about cats"]
    drops = op(group(first))
    assert drops == {1: "exact duplicate of trajectory g-0",
                     2: "near duplicate (MinHash Jaccard >= 0.5) of trajectory g-0"}  # "4" is too short to dedup
    # across the run: the same task's later group; another task's identical response is no duplicate
    assert op(group([LONG, "something new entirely for this task here"], gid="h")) == {
        0: "exact duplicate of trajectory g-0"}
    assert op(group([LONG, "x y z w"], prompt="Another prompt.", gid="k")) == {}
    # a redelivered group (same traj_ids) is not its own duplicate: the same verdicts as the first time
    assert op(group(first)) == drops


def test_dedup_memory_is_bounded_and_can_span_one_group():
    op = dedup.make(window=2, min_words=1, near=False)
    op(group(["one two three", "four five six", "seven eight nine"]))  # the first is evicted
    assert op(group(["one two three", "seven eight nine"], gid="h")) == {1: "exact duplicate of trajectory g-2"}
    per_group = dedup.make(across_run=False, min_words=1)
    assert per_group(group(["a b c", "a b c"])) == {1: "exact duplicate of trajectory g-0"}
    assert per_group(group(["a b c", "d e f"], gid="h")) == {}


def test_prompt_copy_drops_copies_and_dead_letters_a_leaked_answer():
    prompt = "Write a haiku about the sea and the moon at night please"
    assert prompt_copy.copied_fraction("about the sea and the moon at night", prompt, 5) == 1.0
    assert prompt_copy.copied_fraction("the sea and the moon are bright tonight", prompt, 5) == pytest.approx(1 / 4)
    op = prompt_copy.make(n=5, max_overlap=0.8)
    assert op(group(["about the sea and the moon at night", "waves under moonlight"], prompt=prompt)) == {
        0: "1.000 of its 5-grams are copied from the prompt (> 0.8)"}
    with pytest.raises(RecordRejected, match="appears verbatim in its prompt"):
        op(group(["x", "y"], prompt="The answer is 1234. What is it?", answer="1234"))
    assert op(group(["x", "y"], prompt="What is 2+2? 4 digits.", answer="4")) == {}  # too short to check


def drop_second(**params):
    def op(g):
        return {1: f"user op {params['why']}"} if len(g.trajectories) > 1 else {}
    return op


def cfg(ops: list[dict], **stream_ops) -> RunConfig:
    return RunConfig.model_validate({"model": {"path": "unused"},
                                     "stream_ops": {"rewards": [{"name": "exact_match"}], "ops": ops, **stream_ops}})


def test_config_names_the_field_and_allowed_values():
    with pytest.raises((ConfigError, ValueError), match=r"type='nope' is not one of \['length'"):
        cfg([{"type": "nope"}])
    with pytest.raises((ConfigError, ValueError), match="needs `type`"):
        cfg([{"params": {}}])
    with pytest.raises(ValueError, match=r"stream_ops.ops\[0\] \(length\): max_chars=-3"):
        build_cleaning(cfg([{"type": "length", "params": {"max_chars": -3}}]))


def test_pipeline_through_route_record():
    from streamrft.stream_ops.scoring import build_scorer

    run = cfg([{"type": "length", "params": {"max_chars": 10}},
               {"import_path": "tests.stream_ops.test_ops:drop_second", "params": {"why": "said so"}},
               {"type": "prompt_copy"}], drop_zero_variance=False)
    scorer = build_scorer(run)  # the worker's scorer runs the config's ops before scoring
    cleaning = scorer.cleaning

    def route(g: RolloutGroup):
        return route_record(scorer, "ns", encode(g), g.group_id.encode(), "ns.rollouts.default", 0, 7)

    out = route(group(["4", "5", "far too long a response", "4"]))
    exp = decode(out.value)
    assert out.kind == "experience" and [t.traj_id for t in exp.trajectories] == ["g-0", "g-3"]
    assert exp.dropped == {"g-2": "length: 23 chars > max_chars 10",
                           "g-1": "tests.stream_ops.test_ops:drop_second: user op said so"}
    assert exp.rewards == [1.0, 1.0]
    # two of three dropped: fewer than 2 left -> filtered like a zero-variance group
    assert route(group(["4", "5", "far too long a response"], gid="f")).kind == "filtered"
    leaked = route(group(["4", "5"], prompt="answer: 12345", answer="12345", gid="d"))
    assert leaked.kind == "dead_letter"
    dead = decode(leaked.value)
    assert dead.error_type == "RecordRejected" and "op 'prompt_copy': the task's answer '12345'" in dead.reason
    assert cleaning.metrics() == {
        "op.length.dropped": 2.0, "op.length.dead_lettered": 0.0,
        "op.tests.stream_ops.test_ops:drop_second.dropped": 3.0,  # ran before prompt_copy
        "op.tests.stream_ops.test_ops:drop_second.dead_lettered": 0.0,
        "op.prompt_copy.dropped": 0.0, "op.prompt_copy.dead_lettered": 1.0, "op.groups_emptied": 1.0}


def test_no_ops_is_the_identity():
    g = group(["4", "5"])
    assert Cleaning([]).clean(g) == (g, {})
