"""Reward-hacking guards against copying from the prompt.

A response that mostly repeats the prompt (the fraction of its word `n`-grams found in the prompt
is over `max_overlap`) is dropped. A task whose answer appears verbatim in its prompt leaks its
answer: with `leaked_answer: dead_letter` (the default) the record is dead-lettered, since every
response could copy the answer and score; `ignore` lets it through. Answers shorter than
`min_answer_chars` are not checked ("4" is in many prompts by chance).
"""
from __future__ import annotations

from streamrft.stream_ops.errors import RecordRejected


def copied_fraction(response: str, prompt: str, n: int) -> float:
    """The fraction of the response's word n-grams that are also in the prompt."""
    words, source = response.split(), prompt.split()
    grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    if not grams:
        return 0.0
    seen = {tuple(source[i:i + n]) for i in range(len(source) - n + 1)}
    return sum(1 for g in grams if g in seen) / len(grams)


def make(n: int = 5, max_overlap: float = 0.8, leaked_answer: str = "dead_letter", min_answer_chars: int = 4):
    if leaked_answer not in ("dead_letter", "ignore"):
        raise ValueError(f"leaked_answer={leaked_answer!r} is not one of ['dead_letter', 'ignore']")
    if not 0.0 <= max_overlap <= 1.0 or n < 1:
        raise ValueError("max_overlap must be in [0, 1] and n >= 1")

    def prompt_copy_op(group) -> dict[int, str]:
        answer = (group.task.answer or "").strip()
        if leaked_answer == "dead_letter" and len(answer) >= min_answer_chars and answer in group.task.prompt:
            raise RecordRejected(f"the task's answer {answer[:80]!r} appears verbatim in its prompt")
        drops = {}
        for i, t in enumerate(group.trajectories):
            f = copied_fraction(t.response_text, group.task.prompt, n)
            if f > max_overlap:
                drops[i] = f"{f:.3f} of its {n}-grams are copied from the prompt (> {max_overlap})"
        return drops

    return prompt_copy_op
