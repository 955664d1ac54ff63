"""Warm-up demonstrations: episodes played by a scripted player, laid out token for token as the
multi-turn workflows lay out the model's own episodes.

`demonstration(tokenizer, task, env, player)` plays one episode: each action is tokenized as the
model would have sampled it (its text, then the stop token) and masked 1; the ids between turns
come from the same `TurnEncoder` as in `episodes.py` and are masked 0. An SFT stage on these
sequences (`engine.sft.sft_on_sequences`) teaches exactly the layout RL will then sample from.
`mixture` draws the player of each episode from weights, e.g. `{"bisect": 0.1, "linear": 0.9}`:
a warm-up that plays mostly badly leaves RL something to find.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable

from streamrft.producers.envs import Environment, Player
from streamrft.producers.workflows.episodes import Episode, TurnLimits
from streamrft.producers.workflows.turns import TurnEncoder
from streamrft.schemas import Task


@dataclass
class Demonstration:
    player: str
    ids: list[int]
    """Prompt, then every turn."""
    loss_mask: list[int]
    """1 on the player's tokens (its actions and their stop tokens), 0 on the prompt and between turns."""
    env_reward: float


def demonstration(tokenizer: Any, task: Task, env: Environment, player: Player, *, name: str = "",
                  limits: TurnLimits = TurnLimits(), chat: bool = False) -> Demonstration:
    encoder = TurnEncoder(tokenizer, chat)
    stop = tokenizer.eos_token_id
    e = Episode(task, env, encoder.prompt(task, env.reset(task)))
    turns: list[tuple[str, str]] = []
    while True:
        action = player(task, env, turns)
        ids = tokenizer(action, add_special_tokens=False)["input_ids"] + [stop]
        if e.length + len(ids) > limits.max_total_tokens:
            raise ValueError(f"a {name or 'scripted'} episode of task {task.task_id} needs more than "
                             f"max_total_tokens={limits.max_total_tokens} tokens")
        turn = e.add_model_turn(ids, [0.0] * len(ids), action, "stop")
        observation, reward, done, _ = env.step(action)
        turn.reward = float(reward)
        if done or len(e.turns) >= limits.max_turns:
            break
        e.add_other_tokens(encoder.between(observation, stop_id=stop))
        turns.append((action, observation))
    return Demonstration(name, e.prompt_ids + e.response_ids, [0] * len(e.prompt_ids) + e.loss_mask, e.env_reward)


def mixture(tokenizer: Any, tasks: list[Task], env: Callable[[], Environment], players: dict[str, Player],
            weights: dict[str, float], *, seed: int = 0, limits: TurnLimits = TurnLimits(),
            chat: bool = False) -> list[Demonstration]:
    """One demonstration per task, its player drawn from `weights` (names of `players`)."""
    unknown = sorted(set(weights) - set(players))
    if unknown or not weights:
        raise ValueError(f"demonstration players {unknown or '{}'} are not among {sorted(players)}")
    if any(w < 0 for w in weights.values()) or sum(weights.values()) <= 0:
        raise ValueError(f"player weights must be >= 0 with a positive sum, got {weights}")
    rng = random.Random(f"demos:{seed}")
    names, w = list(weights), list(weights.values())
    out = []
    for task in tasks:
        name = rng.choices(names, w)[0]
        out.append(demonstration(tokenizer, task, env(), players[name], name=name, limits=limits, chat=chat))
    return out
