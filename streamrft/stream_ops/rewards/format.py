"""Format check: 1.0 when the response matches the regex `pattern` (re.search, DOTALL), else 0.0.

>>> format_reward("<think>x</think> 4", None, pattern=r"^<think>.*</think>")
1.0
"""
from __future__ import annotations

import re


def format_reward(response: str, answer: str | None = None, *, pattern: str, **params) -> float:
    return 1.0 if re.search(pattern, response, flags=re.DOTALL) else 0.0
