"""What an environment is: `reset(task) -> observation`, `step(action_text) -> (observation, reward, done, info)`.

Plain Python, text in and text out (an observation may also show pictures: `Observation`): the
workflows (`streamrft.producers.workflows`) own the tokens, so an environment never sees a token
id and works the same with any model or chat template.
A workflow makes a fresh environment for every episode, so an instance may keep its episode's state.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Protocol, runtime_checkable

from streamrft.schemas import Task


class Observation(NamedTuple):
    """An observation that shows pictures (a vision-language model's environment): `reset` and
    `step` may return one wherever they return a str. Each image (a `PIL.Image`, or the bytes of a
    PNG, JPEG, WebP or GIF file) is stored once in the run's media store by its sha256, and the
    trajectory carries its reference; the model sees the images, then the text."""

    text: str
    images: tuple = ()


class StepResult(NamedTuple):
    """What `step` returns; any 4-tuple in this order will do."""

    observation: str | Observation
    """The environment's answer, shown to the model as the next turn (unused once `done`)."""
    reward: float
    """This step's reward (finite); the episode's `env_reward` is the sum over its steps."""
    done: bool
    """The episode is over: no further model turn."""
    info: dict[str, Any]
    """A JSON object; the last step's travels in the trajectory's `info["env_info"]`."""


@runtime_checkable
class Environment(Protocol):
    def reset(self, task: Task) -> "str | Observation":
        """Start an episode of `task`; return the first observation (the prompt the model sees)."""
        ...

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        """Apply the model's turn (its decoded text, special tokens dropped); see `StepResult`."""
        ...
