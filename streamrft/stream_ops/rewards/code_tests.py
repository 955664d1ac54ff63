"""Code execution reward: the fraction of the task's tests that the response's code passes.

The code is the last ```python (or bare ```) fence in the response, else the whole response. The
tests are `task.metadata["tests"]` (a list) if present, else the task's answer: a JSON list, or
plain text with one `assert ...` per line. Each test is `assert call(literal args) == literal` (or
another form `sandbox.cases` splits: !=, is, in, truthy, math.isclose) or an object
{"call", "expected"} / {"stdin", "stdout"}; a test of another shape is refused (`TestFormatError`,
also when the explorer loads the task file: `check_task`). The sandbox runs the calls after the
code and the parent compares what they returned with the expected values, which never enter the
sandbox. Partial credit: 2 of 3 tests passed -> 0.667. `blocking = True`: the scorer may run it
off the event loop in a thread pool. Params: `cpu_s`, `memory_mb`, `wall_s`, `isolate`, ...
(`sandbox.Limits`).

>>> code_tests("```python\\ndef f(x):\\n    return x + 1\\n```", "assert f(1) == 2\\nassert f(2) == 4")
0.5
"""
from __future__ import annotations

import json
import re

from dataclasses import fields

from streamrft.stream_ops.sandbox import Case, Limits, parse_cases, run_cases

FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def extract_code(response: str) -> str:
    """The last fenced code block of the response (the final answer), else the whole response."""
    blocks = FENCE.findall(response)
    return blocks[-1] if blocks else response


def parse_tests(answer: str | None, metadata: dict | None = None) -> list:
    """The tests: metadata["tests"], else the answer as a JSON list, else its non-empty lines."""
    if metadata and isinstance(metadata.get("tests"), list):
        return [t if isinstance(t, dict) else str(t) for t in metadata["tests"]]
    if not answer or not answer.strip():
        return []
    text = answer.strip()
    if text.startswith("["):
        try:
            tests = json.loads(text)
        except ValueError:
            tests = None
        if isinstance(tests, list):
            return [t if isinstance(t, dict) else str(t) for t in tests]
    return [line for line in text.splitlines() if line.strip()]


def load_cases(answer: str | None, metadata: dict | None = None) -> list[Case]:
    """The task's tests split into inputs and expected values; ValueError if it has none or one cannot be split."""
    tests = parse_tests(answer, metadata)
    if not tests:
        raise ValueError("code_tests: the task has no tests (task.metadata['tests'] or the answer)")
    return parse_cases(tests)


def limits(params: dict) -> Limits:
    allowed = [f.name for f in fields(Limits)]
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise ValueError(f"code_tests: unknown params {unknown}; allowed: {allowed}")
    return Limits(**params)


def code_tests(response: str, answer: str | None, *, task=None, **params) -> float:
    cases = load_cases(answer, task.metadata if task is not None else None)
    return run_cases(extract_code(response), cases, limits(params)).fraction


def check_task(task, **params) -> None:
    """Raise ValueError naming the test if the task's tests cannot be run by `code_tests` (load time)."""
    limits(params)
    load_cases(task.answer, task.metadata)


code_tests.blocking = True
code_tests.check_task = check_task
