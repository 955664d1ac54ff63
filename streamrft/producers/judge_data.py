"""Training pairs for a small judge of the reversal demo: (judge prompt, judge answer) from the rule.

A judge model for `examples/judge_cpu.yaml` that runs on two cores: a char-level causal LM taught by
SFT to read "Expected: dcba / Got: dcxa / Marks:" and answer " ++-+ Score: 7": a mark per position
(the response's letter agrees with the reference's, or not), then the reversal rule's partial credit
(`rewards.reverse`) times 9, rounded. Its RL run then scores every trajectory with this model through
the `judge` reward (a rubric prompt, a generated answer, the score parsed from its "Score: N"), never
with the rule; the rule only wrote the judge's lessons, as a human grader's labels would.

Why the marks: a judge taught to answer the digit alone (one supervised token per example) stalled
at a loss of ~0.65 and graded by length: "9" for "dddd" against "hcfg"; a policy trained by it
learned to answer the first letter and filler ("hdff"). Marking each position first, as an LLM
judge reasons before its score, gives every compared letter its own lesson.

The responses it learns to grade are drawn like a policy's answers: exact answers, one to all
letters wrong, a right prefix then anything (a policy learning left to right), cut short, run on,
the string unreversed, random strings, and the policy's own stray characters (the prompt's "rev ",
"=").
"""
from __future__ import annotations

import random

from streamrft.producers.synthetic import ALPHABET, LETTERS, MAX_LEN, MIN_LEN, make_demo_tasks

JUDGE_TEMPLATE = "Expected: {answer}\nGot: {response}\nMarks:"
"""The judge prompt: `rubric.render` fills {answer} and {response}."""
SCORE_MAX = 9
JUDGE_MAX_NEW_TOKENS = 24
"""Enough for the longest answer: a mark for each of up to 10 positions, then " Score: 9"."""
JUDGE_ALPHABET = "".join(sorted(set(ALPHABET + JUDGE_TEMPLATE.replace("{answer}", "").replace("{response}", "")
                                    + "+- Score:0123456789")))
"""Every character a judge prompt or its answer can hold: the judge's char vocabulary."""


def corrupt(answer: str, rng: random.Random, max_len: int = 10) -> str:
    """A response to grade: the answer itself or one of the ways a policy gets it wrong."""
    kind = rng.choices(["exact", "substitute", "prefix", "truncate", "extend", "unreversed", "random", "stray"],
                       weights=[20, 20, 20, 12, 10, 5, 7, 6])[0]
    letters = list(answer)
    if kind == "exact":
        return answer
    if kind == "prefix":  # right for the first k letters, of the right length: a policy's answer in mid-training
        k = rng.randint(1, len(answer) - 1)
        return answer[:k] + "".join(rng.choice(LETTERS) for _ in range(len(answer) - k))
    if kind == "substitute":
        for i in rng.sample(range(len(letters)), rng.randint(1, len(letters))):
            letters[i] = rng.choice([c for c in LETTERS if c != letters[i]])
        return "".join(letters)
    if kind == "truncate":
        return answer[:rng.randint(0, len(answer) - 1)]
    if kind == "extend":
        return (answer + "".join(rng.choice(LETTERS) for _ in range(rng.randint(1, 4))))[:max_len]
    if kind == "unreversed":
        return answer[::-1]
    if kind == "random":
        return "".join(rng.choice(LETTERS) for _ in range(rng.randint(1, max_len)))
    at = rng.randint(0, len(letters))
    return "".join(letters[:at]) + rng.choice(["rev ", "=", " ", "v", "r"]) + "".join(letters[at:])


def judge_score(response: str, answer: str) -> int:
    """The digit the judge learns: the rule's partial credit on 0..SCORE_MAX."""
    from streamrft.stream_ops.rewards.reverse import reverse_reward

    return round(SCORE_MAX * reverse_reward(response, answer))


def judge_answer(response: str, answer: str) -> str:
    """What the judge learns to answer: " " + a mark per position ("+" the letters agree, "-" they
    differ or one string has ended), then " Score: <judge_score>"."""
    response, answer = response.strip(), answer.strip()
    marks = "".join("+" if i < len(response) and i < len(answer) and response[i] == answer[i] else "-"
                    for i in range(max(len(response), len(answer))))
    return f" {marks} Score: {judge_score(response, answer)}"


def make_judge_pairs(n: int, seed: int = 0, template: str = JUDGE_TEMPLATE, split: str = "train",
                     min_len: int = MIN_LEN, max_len: int = MAX_LEN) -> list[tuple[str, str]]:
    """`n` (judge prompt, judge answer) pairs on the `split`'s strings."""
    from streamrft.stream_ops.rewards.rubric import render

    rng = random.Random(f"judge:{seed}")
    pairs = []
    for task in make_demo_tasks(n, seed=seed, split=split, min_len=min_len, max_len=max_len):
        response = corrupt(task["answer"], rng)
        prompt = render(template, prompt=task["prompt"], response=response, answer=task["answer"])
        pairs.append((prompt, judge_answer(response, task["answer"])))
    return pairs
