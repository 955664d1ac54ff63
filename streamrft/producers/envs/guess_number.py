"""Guess-the-number, a multi-turn game small enough for the tiny CPU char model to learn.

Rules (one episode):
- The secret is the task's `answer`, an integer in [low, high]; the first observation is the task's
  prompt (`make_tasks` writes "guess 1-8:").
- Every model turn is one guess: its text, stripped, must be an integer ("5"). Anything else
  earns "invalid:" and still costs a guess.
- The environment answers "higher:" when the secret is above the guess and "lower:" when below
  (a guess outside the range included); a right guess ends the episode ("correct").
- After `max_guesses` guesses without finding it the episode ends ("lost").
- Reward, all on the last step: 1 - turn_penalty x (guesses - 1) for a win (never below 0), 0 for a loss.

A transcript (prompt, then model and environment turns; each model turn ends with its EOS token):
`guess 1-8:` `4` `higher:` `6` `lower:` `5` -> correct, reward 0.9. Binary search finds any of the
8 secrets within the default 4 guesses (mean reward 0.92); guessing 1, 2, 3, 4 in order wins half of
them. Every character the game writes is in `ALPHABET`, so a char tokenizer built over it
(`model.build.alphabet`) encodes every episode exactly.
"""
from __future__ import annotations

import random
import re
from typing import Any

from streamrft.producers.envs.base import StepResult
from streamrft.schemas import Task

HIGHER, LOWER, INVALID, CORRECT, LOST = "higher:", "lower:", "invalid:", "correct", "lost"
_GUESS = re.compile(r"-?\d{1,9}")


def prompt_text(low: int, high: int) -> str:
    return f"guess {low}-{high}:"


ALPHABET = "".join(sorted(set("0123456789" + prompt_text(-1, 0) + HIGHER + LOWER + INVALID + CORRECT + LOST)))
"""Every character a prompt of `make_tasks`, a guess or a feedback can hold."""


class GuessNumber:
    def __init__(self, low: int = 1, high: int = 8, max_guesses: int = 4, turn_penalty: float = 0.05):
        if low > high or max_guesses < 1 or not 0 <= turn_penalty <= 1:
            raise ValueError(f"need low <= high, max_guesses >= 1, 0 <= turn_penalty <= 1; got "
                             f"low={low}, high={high}, max_guesses={max_guesses}, turn_penalty={turn_penalty}")
        self.low, self.high, self.max_guesses, self.turn_penalty = low, high, max_guesses, turn_penalty
        self.secret: int | None = None
        self.guesses = 0

    def reset(self, task: Task) -> str:
        try:
            secret = int(task.answer or "")
        except ValueError:
            raise ValueError(f"task {task.task_id}: answer {task.answer!r} is not an integer secret") from None
        if not self.low <= secret <= self.high:
            raise ValueError(f"task {task.task_id}: secret {secret} is outside [{self.low}, {self.high}]")
        self.secret, self.guesses = secret, 0
        return task.prompt

    def step(self, action: str) -> StepResult:
        if self.secret is None:
            raise RuntimeError("step() before reset()")
        self.guesses += 1
        text = action.strip()
        guess = int(text) if _GUESS.fullmatch(text) else None
        info: dict[str, Any] = {"guesses": self.guesses}
        if guess == self.secret:
            reward = max(0.0, 1.0 - self.turn_penalty * (self.guesses - 1))
            return StepResult(CORRECT, reward, True, {**info, "outcome": "won"})
        if self.guesses >= self.max_guesses:
            return StepResult(LOST, 0.0, True, {**info, "outcome": "lost"})
        if guess is None:
            return StepResult(INVALID, 0.0, False, info)
        return StepResult(HIGHER if self.secret > guess else LOWER, 0.0, False, info)


def make_tasks(n: int, seed: int = 0, low: int = 1, high: int = 8) -> list[dict]:
    """`n` tasks `{"task_id", "prompt", "answer"}` with uniformly drawn secrets; deterministic in its arguments."""
    rng = random.Random(f"guess:{seed}")
    return [{"task_id": f"guess-{seed}-{i}", "prompt": prompt_text(low, high), "answer": str(rng.randint(low, high))}
            for i in range(n)]


# ---- scripted players, for warm-up demonstrations (`workflows.demonstrations`) ----------------------
def _interval(env: GuessNumber, turns: list[tuple[str, str]]) -> tuple[int, int]:
    """What the feedback so far leaves possible, [lo, hi]."""
    lo, hi = env.low, env.high
    for action, observation in turns:
        guess = int(action)
        if observation == HIGHER:
            lo = max(lo, guess + 1)
        elif observation == LOWER:
            hi = min(hi, guess - 1)
    return lo, hi


def play_bisect(task: Task, env: GuessNumber, turns: list[tuple[str, str]]) -> str:
    """Binary search: the middle (rounded down) of what is still possible; mean reward 0.92 on 1-8."""
    lo, hi = _interval(env, turns)
    return str((lo + hi) // 2)


def play_linear(task: Task, env: GuessNumber, turns: list[tuple[str, str]]) -> str:
    """Counts up from the lowest number, ignoring the feedback: wins only the low half in 4 guesses
    on 1-8 (mean reward 0.46)."""
    return str(env.low + len(turns))


PLAYERS = {"bisect": play_bisect, "linear": play_linear}
