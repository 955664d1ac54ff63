"""The judge's prompt and the reading of its answer: pure functions, shared by every back end.

`render(template, prompt=, response=, answer=)` fills `{prompt}`, `{response}` and `{answer}` in
one pass (a response that contains "{answer}" stays as written; other braces are left alone, so a
rubric may show JSON). `parse_score(text, low, high)` reads the judge's score and maps [low, high]
to [0, 1]; an answer without a score in range raises `MalformedAnswer` (the term then retries).

>>> render("Q: {prompt} A: {response} {x}", prompt="2+2", response="{answer}", answer="4")
'Q: 2+2 A: {answer} {x}'
>>> parse_score("The answer is right.\\nScore: 8/10", 0, 10)
0.8
"""
from __future__ import annotations

import re

FIELDS = ("prompt", "response", "answer")
_FIELD = re.compile(r"\{(" + "|".join(FIELDS) + r")\}")
_LABELLED = re.compile(r"(?i)\b(?:score|rating|grade)\b\s*(?:is|of)?\s*[:=]?\s*\**\s*(-?\d+(?:\.\d+)?)")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")

DEFAULT_TEMPLATE = (
    "You are grading a response to a task.\n"
    "Task: {prompt}\n"
    "Reference answer: {answer}\n"
    "Response: {response}\n"
    "Rate how well the response solves the task, from 0 (wrong) to 10 (fully correct). "
    "Reply with one line: Score: <number>"
)


class MalformedAnswer(ValueError):
    """The judge's answer holds no score in the configured range."""


def render(template: str, *, prompt: str, response: str, answer: str | None) -> str:
    """The template with `{prompt}`, `{response}`, `{answer}` filled in (a missing answer: empty)."""
    values = {"prompt": prompt, "response": response, "answer": answer if answer is not None else ""}
    return _FIELD.sub(lambda m: values[m.group(1)], template)


def parse_score(text: str, low: float = 0.0, high: float = 10.0, pattern: str | None = None) -> float:
    """(score - low) / (high - low) of the score in `text`.

    The score is group 1 of `pattern` when given; else the number after "Score"/"Rating"/"Grade"
    (the last such label: a judge that reasons first ends with its verdict); else the first number
    in the text. A score outside [low, high], or none at all, raises `MalformedAnswer`.
    """
    if high <= low:
        raise ValueError(f"score range [{low}, {high}] is empty")
    if pattern is not None:
        m = re.search(pattern, text, flags=re.DOTALL)
        found = m.group(1) if m else None
    else:
        labelled = _LABELLED.findall(text)
        first = _NUMBER.search(text)
        found = labelled[-1] if labelled else (first.group(0) if first else None)
    if found is None:
        raise MalformedAnswer(f"no score in the judge's answer {_clip(text)!r}")
    try:
        score = float(found)
    except ValueError:
        raise MalformedAnswer(f"score {found!r} in the judge's answer is not a number") from None
    if not low <= score <= high:
        raise MalformedAnswer(f"score {score:g} outside [{low:g}, {high:g}] in the judge's answer {_clip(text)!r}")
    return (score - low) / (high - low)


def _clip(text: str, n: int = 200) -> str:
    return text if len(text) <= n else text[:n] + "..."
