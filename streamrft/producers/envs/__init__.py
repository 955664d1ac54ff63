"""Environments for multi-turn workflows, chosen by `explorer.env.type` from `ENVIRONMENTS`.

An environment is any class with `reset(task) -> observation` and `step(action_text) ->
(observation, reward, done, info)` (`base.Environment`); the workflow builds a fresh one per
episode as `cls(**explorer.env.params)`. Write your own and name it with `import_path`, with no
edit of streamrft:

    # mypkg/envs.py: say the numbers from `start` down to 1, one per turn
    from streamrft.producers.envs import StepResult

    class Countdown:
        def __init__(self, start: int = 3):
            self.start = start

        def reset(self, task) -> str:
            self.next = self.start
            return task.prompt                  # the first observation is the prompt

        def step(self, action: str) -> StepResult:
            if action.strip() != str(self.next):
                return StepResult("wrong", 0.0, True, {"reached": self.next})
            self.next -= 1
            if self.next == 0:
                return StepResult("done", 1.0, True, {})
            return StepResult(" next:", 0.0, False, {})  # the model's next prompt; masked from the loss

    # run.yaml
    explorer:
      workflow: multi_turn
      env: {import_path: "mypkg.envs:Countdown", params: {start: 3}}

Shipped: `guess_number` (a multi-turn game the tiny CPU model can learn) and `calculator` (tool use).
"""
from __future__ import annotations

import functools
import sys
from typing import Any, Callable

from streamrft.producers.envs.base import Environment, Observation, StepResult
from streamrft.producers.envs import calculator, guess_number
from streamrft.producers.envs.calculator import Calculator
from streamrft.producers.envs.guess_number import GuessNumber

ENVIRONMENTS: dict[str, type] = {
    "guess_number": GuessNumber,
    "calculator": Calculator,
}

EnvFactory = Callable[[], Environment]

Player = Callable[..., str]
"""A scripted policy, `player(task, env, turns) -> action text`, `turns` the episode's (action,
observation) pairs so far: what warm-up demonstrations are played with."""

PLAYERS: dict[str, dict[str, Player]] = {"guess_number": guess_number.PLAYERS, "calculator": calculator.PLAYERS}
"""Each shipped environment's scripted players, by name."""

TASKS: dict[str, Callable[..., list[dict]]] = {"guess_number": guess_number.make_tasks, "calculator": calculator.make_tasks}
"""Each shipped environment's task generator, `make_tasks(n, seed=..., **params) -> [{task_id, prompt, answer}]`."""

ALPHABETS: dict[str, str] = {"guess_number": guess_number.ALPHABET, "calculator": calculator.ALPHABET}
"""Every character each shipped environment's tasks and turns can hold (a char tokenizer's vocabulary)."""


def _own(import_path: str, name: str) -> Any:
    """Attribute `name` of the environment class at `import_path`, else of its module (None: neither)."""
    cls = env_factory(None, import_path).func
    found = getattr(cls, name, None)
    return found if found is not None else getattr(sys.modules[cls.__module__], name, None)


def env_players(type: str | None, import_path: str | None = None) -> dict[str, Player] | None:
    """An environment's scripted players by name (warm-up demonstrations, `data.demos`): a shipped
    one's `PLAYERS[type]`; your own environment's `PLAYERS` dict, on its class or in its module."""
    return _own(import_path, "PLAYERS") if import_path else PLAYERS.get(type)


def env_alphabet(type: str | None, import_path: str | None = None) -> str | None:
    """Every character an environment's tasks and turns can hold (a char tokenizer's vocabulary):
    a shipped one's `ALPHABETS[type]`; your own environment's `ALPHABET` string, on its class or in
    its module."""
    return _own(import_path, "ALPHABET") if import_path else ALPHABETS.get(type)


def env_factory(type: str | None, import_path: str | None = None, params: dict[str, Any] | None = None) -> EnvFactory:
    """A zero-argument callable making fresh environments: the class at `import_path`
    ("pkg.module:Class", wins over `type`) or `ENVIRONMENTS[type]`, called with `params`."""
    # the algorithms' look-up (import_path wins, unknown names list the allowed ones); imported
    # here because its package imports torch, which an environment on its own never needs
    from streamrft.engine.algorithms.registry import resolve

    try:
        cls = resolve(ENVIRONMENTS, type, import_path)
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(f"explorer.env.import_path {import_path!r}: {e}. Put its folder on PYTHONPATH (or "
                                  "install it): `streamrft run` and every explorer, evaluator and gateway import it "
                                  "(docs/environments.md)", name=e.name) from e
    return functools.partial(cls, **(params or {}))


__all__ = ["ALPHABETS", "ENVIRONMENTS", "EnvFactory", "Environment", "Observation", "PLAYERS", "Player", "StepResult",
           "TASKS", "env_factory"]
