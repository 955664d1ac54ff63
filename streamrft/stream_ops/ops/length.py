"""Length bounds: drop a trajectory whose response is shorter or longer than allowed.

Characters count `response_text`, tokens count `response_ids`. Params: `min_chars`, `max_chars`,
`min_tokens`, `max_tokens` (None: unbounded).
"""
from __future__ import annotations


def make(min_chars: int = 0, max_chars: int | None = None, min_tokens: int = 0, max_tokens: int | None = None):
    for name, v in (("min_chars", min_chars), ("max_chars", max_chars), ("min_tokens", min_tokens),
                    ("max_tokens", max_tokens)):
        if v is not None and (not isinstance(v, int) or v < 0):
            raise ValueError(f"{name}={v!r} must be an integer >= 0")

    def length_op(group) -> dict[int, str]:
        drops = {}
        for i, t in enumerate(group.trajectories):
            chars, tokens = len(t.response_text), len(t.response_ids)
            if chars < min_chars:
                drops[i] = f"{chars} chars < min_chars {min_chars}"
            elif max_chars is not None and chars > max_chars:
                drops[i] = f"{chars} chars > max_chars {max_chars}"
            elif tokens < min_tokens:
                drops[i] = f"{tokens} tokens < min_tokens {min_tokens}"
            elif max_tokens is not None and tokens > max_tokens:
                drops[i] = f"{tokens} tokens > max_tokens {max_tokens}"
        return drops

    return length_op
