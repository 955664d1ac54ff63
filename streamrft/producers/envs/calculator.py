"""Tool use: the model may call a calculator, `calc(17*23)`, before it answers an arithmetic task.

Rules (one episode):
- The task's prompt is the first observation (`make_tasks` writes "17*23?"); its `answer` is the
  number to find.
- A model turn holding `calc(EXPR)` is a tool call: the first such call is evaluated by a bounded
  arithmetic parser (`arithmetic.py`: + - * / and parentheses, never eval) and the environment
  answers "=391\n", or "=error\n" for an expression it refuses. Text around the call is ignored.
- Each episode allows `max_calls` calls; one more ends the episode with reward 0 ("too_many_calls").
- A turn without a call is the final answer: its stripped text must be a number ("391", "-0.5")
  equal to the task's answer. Reward 1 if it is, else 0; either way the episode ends.

A transcript: `17*23?` `calc(17*23)` `=391\n` `391` -> reward 1. A model that answers at once
must multiply in its head; one that calls the tool and copies the result gets it right every time.
"""
from __future__ import annotations

import random
import re
from fractions import Fraction
from typing import Any

from streamrft.producers.envs.arithmetic import CHARACTERS, ExpressionError, evaluate, render
from streamrft.producers.envs.base import StepResult
from streamrft.schemas import Task

CALL = "calc("
ERROR, RIGHT, WRONG, NO_CALLS = "error", "right", "wrong", "no calls left"
_NUMBER = re.compile(r"-?\d{1,15}(\.\d{1,15})?")


def result_text(value: str) -> str:
    return f"={value}\n"


ALPHABET = "".join(sorted(set(CHARACTERS | set(CALL + ")" + "?" + result_text(ERROR) + RIGHT + WRONG + NO_CALLS))))
"""Every character a prompt of `make_tasks`, a tool call, a result or an answer can hold."""


def find_call(text: str) -> str | None:
    """The argument of the first `calc(...)` in `text` (balanced parentheses; "" when unclosed), else None."""
    start = text.find(CALL)
    if start < 0:
        return None
    depth, i = 1, start + len(CALL)
    while i < len(text):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return text[start + len(CALL):i]
        i += 1
    return ""


class Calculator:
    def __init__(self, max_calls: int = 2):
        if max_calls < 0:
            raise ValueError(f"max_calls must be >= 0, got {max_calls}")
        self.max_calls = max_calls
        self.answer: Fraction | None = None
        self.calls = 0

    def reset(self, task: Task) -> str:
        if task.answer is None or not _NUMBER.fullmatch(task.answer.strip()):
            raise ValueError(f"task {task.task_id}: answer {task.answer!r} is not a number")
        self.answer, self.calls = Fraction(task.answer.strip()), 0
        return task.prompt

    def step(self, action: str) -> StepResult:
        if self.answer is None:
            raise RuntimeError("step() before reset()")
        expression = find_call(action)
        if expression is not None:
            self.calls += 1
            info: dict[str, Any] = {"calls": self.calls}
            if self.calls > self.max_calls:
                return StepResult(NO_CALLS, 0.0, True, {**info, "outcome": "too_many_calls"})
            try:
                return StepResult(result_text(render(evaluate(expression))), 0.0, False, info)
            except ExpressionError as e:
                return StepResult(result_text(ERROR), 0.0, False, {**info, "error": str(e)})
        text = action.strip()
        right = bool(_NUMBER.fullmatch(text)) and Fraction(text) == self.answer
        return StepResult(RIGHT if right else WRONG, 1.0 if right else 0.0, True,
                          {"calls": self.calls, "outcome": "right" if right else "wrong"})


def make_tasks(n: int, seed: int = 0, max_operand: int = 99, ops: str = "+-*") -> list[dict]:
    """`n` tasks `{"task_id", "prompt": "17*23?", "answer": "391"}` with operands in [0, max_operand]."""
    if not ops or set(ops) - set("+-*/"):
        raise ValueError(f"ops must be a non-empty subset of '+-*/', got {ops!r}")
    rng = random.Random(f"calc:{seed}")
    rows = []
    while len(rows) < n:
        a, op, b = rng.randint(0, max_operand), rng.choice(ops), rng.randint(0, max_operand)
        if op == "/" and b == 0:
            continue
        expression = f"{a}{op}{b}"
        rows.append({"task_id": f"calc-{seed}-{len(rows)}", "prompt": f"{expression}?",
                     "answer": render(evaluate(expression))})
    return rows


# ---- scripted players, for warm-up demonstrations (`workflows.demonstrations`) ----------------------
def play_tool(task: Task, env: Calculator, turns: list[tuple[str, str]]) -> str:
    """Calls the calculator on the task's expression, then copies its result."""
    if not turns:
        return f"{CALL}{task.prompt.rstrip('?')})"
    return turns[-1][1].removeprefix("=").strip()


def play_direct(task: Task, env: Calculator, turns: list[tuple[str, str]]) -> str:
    """Answers at once with the right number, as if computed in its head: a model imitating this
    learns the answer's look, not the arithmetic."""
    return task.answer or ""


PLAYERS = {"tool": play_tool, "direct": play_direct}
