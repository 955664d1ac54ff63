"""Your own environment, outside the streamrft package: guess-the-letter.

The secret is a letter in a-h; each turn the model names one, and the game answers `later:` (the
secret comes later in the alphabet), `earlier:`, `invalid:`, or ends (`right!` / `lost.`). Four
guesses at most; a win at guess k pays 1 - 0.1 (k - 1).

What streamrft reads here, besides the class (`explorer.env.import_path: letters:GuessLetter`):
- `ALPHABET`: every character a task, a guess or an answer can hold. The tiny char model of
  `model.build` is built over it; any other character would read as `<unk>`.
- `PLAYERS`: scripted players, `player(task, env, turns) -> action text`, `turns` the
  (action, observation) pairs so far. A stage with `data.demos: {bisect: 0.2, sweep: 0.8}` plays
  them on `data.train`'s tasks and warms the model up on their episodes.

This module must be importable wherever an episode is played: by `streamrft run` itself (its
start and final evals), every explorer and the evaluator. Run with the folder on the path:
`PYTHONPATH=examples/my_env streamrft run examples/my_env.yaml` (the roles inherit it).
"""
from __future__ import annotations

import json
import random
import sys
from pathlib import Path

LETTERS = "abcdefgh"
PROMPT = "letter a-h:"
LATER, EARLIER, INVALID, RIGHT, LOST = "later:", "earlier:", "invalid:", "right!", "lost."
ALPHABET = "".join(sorted(set(LETTERS + PROMPT + LATER + EARLIER + INVALID + RIGHT + LOST)))


class GuessLetter:
    """A fresh instance per episode: `reset(task)` then `step(action)` until done."""

    def __init__(self, max_guesses: int = 4):
        self.max_guesses = max_guesses

    def reset(self, task) -> str:
        if task.answer not in tuple(LETTERS):
            raise ValueError(f"task {task.task_id}: answer {task.answer!r} is not one of {LETTERS}")
        self.secret, self.guesses = task.answer, 0
        return task.prompt

    def step(self, action: str):
        self.guesses += 1
        guess = action.strip()
        if guess == self.secret:
            return RIGHT, max(0.0, 1.0 - 0.1 * (self.guesses - 1)), True, {"guesses": self.guesses}
        if self.guesses >= self.max_guesses:
            return LOST, 0.0, True, {"guesses": self.guesses}
        if len(guess) != 1 or guess not in LETTERS:
            return INVALID, 0.0, False, {}
        return (LATER if self.secret > guess else EARLIER), 0.0, False, {}


def _left(turns: list[tuple[str, str]]) -> str:
    """The letters the answers so far leave possible."""
    left = LETTERS
    for action, observation in turns:
        if observation == LATER:
            left = "".join(c for c in left if c > action)
        elif observation == EARLIER:
            left = "".join(c for c in left if c < action)
    return left


def play_bisect(task, env: GuessLetter, turns) -> str:
    """The middle of what is still possible: wins every game in at most 4 guesses."""
    left = _left(turns)
    return left[(len(left) - 1) // 2]


def play_sweep(task, env: GuessLetter, turns) -> str:
    """a, b, c, d whatever the answers: wins only the first half."""
    return LETTERS[len(turns)]


PLAYERS = {"bisect": play_bisect, "sweep": play_sweep}


def write_tasks(out: Path, n: int, seed: int) -> None:
    """`n` tasks as JSONL: {task_id, prompt, answer}."""
    rng = random.Random(seed)
    with open(out, "w") as f:
        for i in range(n):
            f.write(json.dumps({"task_id": f"{out.stem}-{i}", "prompt": PROMPT, "answer": rng.choice(LETTERS)}) + "\n")


if __name__ == "__main__":  # python examples/my_env/letters.py: the task files the example ships
    here = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent
    write_tasks(here / "train.jsonl", 2000, seed=0)
    write_tasks(here / "eval.jsonl", 64, seed=1)
