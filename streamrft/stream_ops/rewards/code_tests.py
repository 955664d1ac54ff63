"""Code execution reward: the fraction of the task's tests that the response's code passes.

The code is the last ```python (or bare ```) fence in the response, else the whole response. The
tests are `task.metadata["tests"]` (a list of Python snippets) if present, else the task's answer:
a JSON list of snippets, or plain text with one `assert ...` per line. Every snippet runs after the
code, in its namespace, in one `streamrft.stream_ops.sandbox` run (no network, rlimits, wall
timeout). Partial credit: 2 of 3 tests passed -> 0.667. `blocking = True`: the scorer may run it
off the event loop in a thread pool. Params: `cpu_s`, `memory_mb`, `wall_s`, ... (sandbox.Limits).

>>> code_tests("```python\\ndef f(x):\\n    return x + 1\\n```", "assert f(1) == 2\\nassert f(2) == 4")
0.5
"""
from __future__ import annotations

import json
import re

from streamrft.stream_ops.sandbox import Limits, run_tests

FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def extract_code(response: str) -> str:
    """The last fenced code block of the response (the final answer), else the whole response."""
    blocks = FENCE.findall(response)
    return blocks[-1] if blocks else response


def parse_tests(answer: str | None, metadata: dict | None = None) -> list[str]:
    """The tests: metadata["tests"], else the answer as a JSON list, else its non-empty lines."""
    if metadata and isinstance(metadata.get("tests"), list):
        return [str(t) for t in metadata["tests"]]
    if not answer or not answer.strip():
        return []
    text = answer.strip()
    if text.startswith("["):
        try:
            tests = json.loads(text)
        except ValueError:
            tests = None
        if isinstance(tests, list):
            return [str(t) for t in tests]
    return [line for line in text.splitlines() if line.strip()]


def code_tests(response: str, answer: str | None, *, task=None, **params) -> float:
    tests = parse_tests(answer, task.metadata if task is not None else None)
    if not tests:
        raise ValueError("code_tests: the task has no tests (task.metadata['tests'] or the answer)")
    return run_tests(extract_code(response), tests, Limits(**params)).fraction


code_tests.blocking = True
