"""The episode loop of the multi-turn workflows: every live episode advances one turn per engine call.

`run_episodes` plays `params.n` episodes of each task in lockstep: one `engine.generate` per turn
with every live episode of the call as its own prompt (n = 1), so a batch of tasks x group_size
episodes costs max-turns engine calls, not one per episode. An episode's ids are its prompt, then
the model's tokens exactly as sampled (mask 1, their behaviour log-probs), then the ids between
turns (`turns.TurnEncoder`: mask 0, log-prob 0.0), and so on; each next prompt is these ids
concatenated, never re-tokenized from text.

An episode ends (its `finish_reason`) when the environment says done (`env_done`), after
`max_turns` model turns (`max_turns`), when a model turn reaches `params.max_new_tokens` without a
stop token (`length`: a cut-off action is never sent to the environment), or when the prompt and
response reach `max_total_tokens` (`max_total_tokens`: the turn that would cross it is cut there).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from streamrft.engine.rollout.base import RolloutEngine, SamplingParams
from streamrft.producers.envs.base import Environment
from streamrft.producers.workflows.turns import TurnEncoder
from streamrft.schemas import Task, new_id

ENV_DONE, MAX_TURNS, LENGTH, MAX_TOTAL_TOKENS = "env_done", "max_turns", "length", "max_total_tokens"


@dataclass(frozen=True)
class TurnLimits:
    """Bounds of one episode; a model turn's own bound is `SamplingParams.max_new_tokens`."""

    max_turns: int = 8
    max_total_tokens: int = 1024

    def __post_init__(self):
        if self.max_turns < 1 or self.max_total_tokens < 2:
            raise ValueError(f"need max_turns >= 1 and max_total_tokens >= 2, got {self}")


@dataclass
class ModelTurn:
    start: int
    """Offset of the turn's first token in the episode's `response_ids`."""
    ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str
    """The engine's ("stop" or "length"), or `max_total_tokens` when the episode's budget cut it."""
    reward: float = 0.0
    """The environment's reward for this turn's action (0 when it never reached the environment)."""


@dataclass
class Episode:
    task: Task
    env: Environment
    prompt_ids: list[int]
    episode_id: str = field(default_factory=new_id)
    response_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    turns: list[ModelTurn] = field(default_factory=list)
    finish_reason: str | None = None
    env_info: dict[str, Any] = field(default_factory=dict)
    """The `info` of the environment's last step."""

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    @property
    def env_reward(self) -> float:
        return sum(t.reward for t in self.turns)

    def add_model_turn(self, ids: list[int], logprobs: list[float], text: str, finish_reason: str) -> ModelTurn:
        turn = ModelTurn(len(self.response_ids), ids, [min(lp, 0.0) for lp in logprobs], text, finish_reason)
        self.turns.append(turn)
        self.response_ids += ids
        self.logprobs += turn.logprobs
        self.loss_mask += [1] * len(ids)
        return turn

    def add_other_tokens(self, ids: list[int]) -> None:
        """Environment and template tokens: not the model's, never trained on."""
        self.response_ids += ids
        self.logprobs += [0.0] * len(ids)
        self.loss_mask += [0] * len(ids)


def run_episodes(engine: RolloutEngine, tasks: list[Task], params: SamplingParams, *,
                 env: Callable[[], Environment], limits: TurnLimits, chat: bool = False) -> list[list[Episode]]:
    """`params.n` finished episodes of each task, in task order."""
    encoder = TurnEncoder(engine.tokenizer, chat)
    episodes: list[list[Episode]] = []
    for task in tasks:
        row = []
        for _ in range(params.n):
            environment = env()
            row.append(Episode(task, environment, encoder.prompt(task, environment.reset(task))))
        episodes.append(row)
    everything = [e for row in episodes for e in row]
    for k in range(limits.max_turns):
        for e in everything:
            if e.finish_reason is None and e.length >= limits.max_total_tokens:
                e.finish_reason = MAX_TOTAL_TOKENS
        live = [e for e in everything if e.finish_reason is None]
        if not live:
            break
        budgets = [min(params.max_new_tokens, limits.max_total_tokens - e.length) for e in live]
        call = dataclasses.replace(params, n=1, max_new_tokens=max(budgets),
                                   seed=None if params.seed is None else params.seed + k)
        outputs = engine.generate([e.prompt_ids + e.response_ids for e in live], call)
        for e, budget, (completion,) in zip(live, budgets, outputs):
            _advance(e, completion, budget, params.max_new_tokens, engine.tokenizer, encoder, limits)
    return episodes


def _advance(e: Episode, completion, budget: int, max_new_tokens: int, tokenizer: Any, encoder: TurnEncoder,
             limits: TurnLimits) -> None:
    """Append one model turn; step the environment with it unless the episode ends first."""
    ids, logprobs, text, reason = completion.token_ids, completion.logprobs, completion.text, completion.finish_reason
    if len(ids) > budget:  # generated for the longest budget of the batch: cut to this episode's own
        ids, logprobs, reason = ids[:budget], logprobs[:budget], MAX_TOTAL_TOKENS
        text = tokenizer.decode(ids, skip_special_tokens=True)
    elif reason == LENGTH and budget < max_new_tokens:
        reason = MAX_TOTAL_TOKENS  # the episode's budget stopped it, not the per-turn one
    turn = e.add_model_turn(ids, logprobs, text, reason)
    if reason != "stop":
        e.finish_reason = reason
        return
    observation, reward, done, info = e.env.step(text)
    turn.reward = float(reward)
    if not math.isfinite(turn.reward) or not isinstance(observation, str):
        raise ValueError(f"environment {type(e.env).__name__} returned observation {observation!r:.40} and reward "
                         f"{reward} (task {e.task.task_id}): the observation must be a str, the reward finite")
    e.env_info = dict(info or {})
    if done:
        e.finish_reason = ENV_DONE
    elif len(e.turns) >= limits.max_turns:
        e.finish_reason = MAX_TURNS
    else:
        between = encoder.between(observation, stop_id=ids[-1])  # reason 'stop': ids end with the stop token
        if e.length + len(between) >= limits.max_total_tokens:
            e.finish_reason = MAX_TOTAL_TOKENS  # no room left for a model token after the observation
        else:
            e.add_other_tokens(between)
