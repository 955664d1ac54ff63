"""The judge's rubric template and the parsing of its answer: pure functions, hand-derived values."""
from __future__ import annotations

import pytest

from streamrft.stream_ops.rewards.rubric import DEFAULT_TEMPLATE, MalformedAnswer, parse_score, render


def test_render_fills_the_three_fields_once_and_leaves_other_braces():
    text = render('{"task": "{prompt}"} -> {response} (ref {answer}) {other}', prompt="2+2", response="4 {prompt}",
                  answer="4")
    assert text == '{"task": "2+2"} -> 4 {prompt} (ref 4) {other}'  # the response's "{prompt}" is not filled
    assert render("ref={answer}", prompt="p", response="r", answer=None) == "ref="
    assert "Task: p\nReference answer: a\nResponse: r\n" in render(DEFAULT_TEMPLATE, prompt="p", response="r", answer="a")


@pytest.mark.parametrize("text,low,high,want", [
    ("Score: 8", 0, 10, 0.8),
    ("score=3/10", 0, 10, 0.3),
    ("**Rating:** 4", 1, 5, 0.75),            # (4 - 1) / (5 - 1)
    ("The response has 2 errors.\nScore: 5", 0, 10, 0.5),  # the labelled number, not the first one
    ("Score: 2. On reflection, Score: 9", 0, 10, 0.9),   # the last verdict
    ("7", 0, 10, 0.7),                         # a bare number
    ("  10.0 ", 0, 10, 1.0),
    ("Grade is 0", 0, 10, 0.0),
])
def test_parse_score(text, low, high, want):
    assert parse_score(text, low, high) == pytest.approx(want)


def test_parse_score_with_a_pattern():
    assert parse_score("verdict <6> because 9", 0, 10, pattern=r"<(\d+)>") == pytest.approx(0.6)
    with pytest.raises(MalformedAnswer, match="no score"):
        parse_score("verdict 6", 0, 10, pattern=r"<(\d+)>")


@pytest.mark.parametrize("text,match", [
    ("I cannot grade this.", "no score"),
    ("", "no score"),
    ("Score: 11", r"outside \[0, 10\]"),
    ("Score: -1", "outside"),
])
def test_malformed_answers_raise(text, match):
    with pytest.raises(MalformedAnswer, match=match):
        parse_score(text, 0, 10)


def test_empty_range_is_an_error():
    with pytest.raises(ValueError, match="empty"):
        parse_score("5", 5, 5)
