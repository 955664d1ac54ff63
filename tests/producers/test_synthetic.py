"""The demo task's data: determinism, disjoint splits, answers, the warm-up pairs, JSONL."""
from __future__ import annotations

import json

import pytest

from streamrft.producers.synthetic import (
    ALPHABET,
    LETTERS,
    make_demo_tasks,
    make_warmup_pairs,
    split_of,
    write_jsonl,
)


def test_tasks_are_deterministic_and_well_formed():
    rows = make_demo_tasks(200, seed=3, split="train")
    assert rows == make_demo_tasks(200, seed=3, split="train")
    assert rows != make_demo_tasks(200, seed=4, split="train")
    assert len({r["task_id"] for r in rows}) == 200
    for r in rows:
        word = r["prompt"].removeprefix("rev ").removesuffix("=")
        assert r["prompt"] == f"rev {word}=" and r["answer"] == word[::-1]
        assert 3 <= len(word) <= 6 and set(word) <= set(LETTERS)
        assert set(r["prompt"] + r["answer"]) <= set(ALPHABET)
    assert {len(r["answer"]) for r in rows} == {3, 4, 5, 6}


def test_splits_are_disjoint():
    train = {r["answer"] for r in make_demo_tasks(2000, seed=0, split="train")}
    evals = {r["answer"] for r in make_demo_tasks(300, seed=0, split="eval")}
    assert not train & evals
    assert all(split_of(a[::-1]) == "eval" for a in evals)
    with pytest.raises(ValueError):
        make_demo_tasks(1, split="test")


def test_warmup_pairs_mix_complete_and_terse_answers():
    full = make_warmup_pairs(100, seed=0, complete_frac=1.0)
    tasks = make_demo_tasks(100, seed=0, split="train")
    assert full == [(t["prompt"], t["answer"]) for t in tasks]
    mixed = make_warmup_pairs(1000, seed=0, complete_frac=0.2)
    complete = sum(len(c) > 1 for _, c in mixed)
    assert 150 < complete < 250
    assert all(len(c) == 1 and c == p[-2] for p, c in mixed if len(c) == 1)  # terse = the last letter


def test_write_jsonl_round_trip(tmp_path):
    rows = make_demo_tasks(5, seed=1, split="eval")
    path = write_jsonl(rows, tmp_path / "sub" / "eval.jsonl")
    assert [json.loads(line) for line in path.read_text().splitlines()] == rows


def test_addition_tasks_are_right_disjoint_and_deterministic():
    import pytest

    from streamrft.producers import arithmetic_tasks

    train = arithmetic_tasks.make_tasks(300, seed=1)
    evals = arithmetic_tasks.make_tasks(50, seed=1, split="eval")
    assert train == arithmetic_tasks.make_tasks(300, seed=1)
    pairs = lambda rows: {r["prompt"] for r in rows}  # noqa: E731
    assert not pairs(train) & pairs(evals)
    for r in train[:50] + evals:
        a, b = (int(x) for x in r["prompt"].removeprefix("What is ").split("?")[0].split(" + "))
        assert 10 <= a <= 99 and 10 <= b <= 99 and r["answer"] == str(a + b)
        assert r["prompt"].endswith("? Answer with just the number.")
    split = arithmetic_tasks.split_of(2, "*", 2)
    (row,) = arithmetic_tasks.make_tasks(1, seed=0, split=split, ops="*", min_operand=2, max_operand=2)
    assert row["prompt"] == "What is 2 * 2? Answer with just the number." and row["answer"] == "4"
    other = "train" if split == "eval" else "eval"
    with pytest.raises(ValueError, match=f"no {other} pair"):
        arithmetic_tasks.make_tasks(1, split=other, ops="*", min_operand=2, max_operand=2)
    with pytest.raises(ValueError, match="ops must be"):
        arithmetic_tasks.make_tasks(1, ops="/")
