"""The episodes of the multi-turn workflows, and their lockstep loop.

`run_episodes` (`explorer.scheduling: lockstep`) plays `params.n` episodes of each task in lockstep: one `engine.generate` per turn
with every live episode of the call as its own prompt (n = 1), so a batch of tasks x group_size
episodes costs max-turns engine calls, not one per episode. An episode's ids are its prompt, then
the model's tokens exactly as sampled (mask 1, their behaviour log-probs), then the ids between
turns (`turns.TurnEncoder`: mask 0, log-prob 0.0), and so on; each next prompt is these ids
concatenated, never re-tokenized from text.

An episode ends (its `finish_reason`) when the environment says done (`env_done`), after
`max_turns` model turns (`max_turns`), when a model turn reaches `params.max_new_tokens` without a
stop token (`length`: a cut-off action is never sent to the environment), or when the prompt and
response reach `max_total_tokens` (`max_total_tokens`: the turn that would cross it is cut there).
An environment that raises or returns a malformed result ends its episode with `env_error` (and,
scheduled one by one, one that outlives `explorer.env.step_timeout_s` with `env_timeout`): such an
episode is never trained as if it had ended normally (`Episode.failed`; the workflows leave it out
of its group). `scheduler.py` plays the same episodes one by one instead of in lockstep.
"""
from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from streamrft.engine.rollout.base import RolloutEngine, SamplingParams, derive_seed
from streamrft.producers.envs.base import Environment, Observation
from streamrft.producers.workflows.turns import Shown, TurnEncoder
from streamrft.schemas import MAX_IMAGES, Task, new_id

ENV_DONE, MAX_TURNS, LENGTH, MAX_TOTAL_TOKENS = "env_done", "max_turns", "length", "max_total_tokens"
MAX_IMAGES_SHOWN = "max_images"  # the observations would show more than a trajectory may carry (MAX_IMAGES)
ENV_ERROR, ENV_TIMEOUT = "env_error", "env_timeout"
FAILED = (ENV_ERROR, ENV_TIMEOUT)
"""Endings the environment caused: the episode is counted, never trained."""

log = logging.getLogger(__name__)


class EnvFailure(Exception):
    """The environment raised, hung past its timeout or answered garbage: `reason` is ENV_ERROR or
    ENV_TIMEOUT, the message says what happened."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


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
    version: int | None = None
    """The weight version that sampled it, when the scheduler records it (turns of one episode differ
    when weights swap between turns); None: the workflow's `version` (lockstep)."""


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
    error: str = ""
    """What the environment did wrong, when `finish_reason` is in FAILED."""
    images: list = field(default_factory=list)
    """The `ImageRef`s whose placeholders the episode's ids hold (the prompt's, then the observations'), in order."""
    pictures: list = field(default_factory=list)
    """The same images as PIL, what the engine samples with."""

    @classmethod
    def start(cls, task: Task, env: Environment, shown: Shown) -> "Episode":
        """An episode whose prompt is `shown` (`TurnEncoder.first`)."""
        return cls(task, env, shown.ids, images=list(shown.images), pictures=list(shown.pictures))

    def show(self, shown: Shown) -> None:
        """Append what the environment showed between two model turns (masked 0), with its images."""
        self.add_other_tokens(shown.ids)
        self.images += shown.images
        self.pictures += shown.pictures

    @property
    def failed(self) -> bool:
        """Ended by its environment's error or timeout: never trained."""
        return self.finish_reason in FAILED

    def fail(self, failure: EnvFailure) -> None:
        self.finish_reason, self.error = failure.reason, str(failure)
        log.warning("episode %s of task %s: %s (%s)", self.episode_id, self.task.task_id, failure.reason, failure)

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    @property
    def env_reward(self) -> float:
        return sum(t.reward for t in self.turns)

    def add_model_turn(self, ids: list[int], logprobs: list[float], text: str, finish_reason: str,
                       version: int | None = None) -> ModelTurn:
        turn = ModelTurn(len(self.response_ids), ids, [min(lp, 0.0) for lp in logprobs], text, finish_reason,
                         version=version)
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


def turn_seed(group_seed: int, episode: int, turn: int) -> int:
    """The seed of an episode's model turn (its index in the group, the turn's among its model
    turns): the same in lockstep and one by one."""
    return derive_seed(group_seed, episode, turn)


def run_episodes(engine: RolloutEngine, tasks: list[Task], params: SamplingParams, *,
                 env: Callable[[], Environment], limits: TurnLimits, chat: bool = False,
                 stats: dict | None = None) -> list[list[Episode]]:
    """`params.n` finished episodes of each task, in task order. `stats["env_s"]` grows by the time
    spent outside the engine's calls: the environments' (and the tokenizer's, a little). With
    `params.seeds` (one per task) each turn is sampled with its own `turn_seed`."""
    t_start, engine_s = time.monotonic(), 0.0
    encoder = TurnEncoder(engine.tokenizer, chat, getattr(engine, "vision", None))
    episodes: list[list[Episode]] = []
    for task in tasks:
        row = []
        for _ in range(params.n):
            environment = env()
            try:
                observation = checked_reset(environment, task)
                prompt = shown(environment, lambda: encoder.first(task, observation))
                row.append(Episode.start(task, environment, prompt))
            except EnvFailure as f:
                row.append(failed_episode(task, environment, f))
        episodes.append(row)
    everything = [e for row in episodes for e in row]
    seeds = None if params.seeds is None else {id(e): (params.seeds[i], j) for i, row in enumerate(episodes)
                                               for j, e in enumerate(row)}
    for k in range(limits.max_turns):
        for e in everything:
            if e.finish_reason is None and e.length >= limits.max_total_tokens:
                e.finish_reason = MAX_TOTAL_TOKENS
        live = [e for e in everything if e.finish_reason is None]
        if not live:
            break
        budgets = [min(params.max_new_tokens, limits.max_total_tokens - e.length) for e in live]
        call = dataclasses.replace(params, n=1, max_new_tokens=max(budgets),
                                   seed=None if params.seed is None else params.seed + k,
                                   seeds=None if seeds is None else [turn_seed(*seeds[id(e)], len(e.turns)) for e in live])
        t0 = time.monotonic()
        images = {"images": [e.pictures for e in live]} if any(e.pictures for e in live) else {}
        outputs = engine.generate([e.prompt_ids + e.response_ids for e in live], call, **images)
        engine_s += time.monotonic() - t0
        for e, budget, (completion,) in zip(live, budgets, outputs):
            turn = model_turn(e, completion, budget, params.max_new_tokens, engine.tokenizer)
            if turn is not None:
                try:
                    answer(e, turn, checked_step(e.env, turn.text, e.task), encoder, limits)
                except EnvFailure as f:
                    e.fail(f)
    for e in everything:
        close_env(e.env)
    if stats is not None:
        stats["env_s"] = stats.get("env_s", 0.0) + time.monotonic() - t_start - engine_s
    return episodes


def kept_episodes(task: Task, episodes: list[Episode], min_episodes: int | None,
                  stats: dict | None = None) -> list[Episode] | None:
    """The episodes of one task's group that ended normally, or None when fewer than `min_episodes`
    did (None: half the group, at least 1): the group is dropped. `stats` counts `env_errors`,
    `env_timeouts` and `groups_dropped_env`."""
    kept = [e for e in episodes if not e.failed]
    if stats is not None:
        for e in episodes:
            if e.failed:
                key = "env_timeouts" if e.finish_reason == ENV_TIMEOUT else "env_errors"
                stats[key] = stats.get(key, 0) + 1
    need = max(1, len(episodes) // 2) if min_episodes is None else min(min_episodes, len(episodes))
    if len(kept) < need:
        if stats is not None:
            stats["groups_dropped_env"] = stats.get("groups_dropped_env", 0) + 1
        log.warning("group of task %s dropped: %d of its %d episodes ended by their environment (at least %d "
                    "must end normally: explorer.min_episodes_per_group)", task.task_id, len(episodes) - len(kept),
                    len(episodes), need)
        return None
    return kept


def shown(env: Environment, encode: Callable[[], Shown]) -> Shown:
    """`encode()` (a `TurnEncoder`'s `first` or `next`); an image the environment showed that cannot
    be used (it does not decode, is too large, or the model sees no images) is its failure."""
    from streamrft.infra.media import MediaError

    try:
        return encode()
    except MediaError as e:
        raise EnvFailure(ENV_ERROR, f"{type(env).__name__} showed an image that cannot be used: {e}") from None


def failed_episode(task: Task, env: Environment, failure: EnvFailure) -> Episode:
    """An episode whose environment failed before its first observation (no prompt)."""
    e = Episode(task, env, prompt_ids=[])
    e.fail(failure)
    return e


def checked_reset(env: Environment, task: Task) -> str | Observation:
    """`env.reset(task)`, its failure an EnvFailure."""
    try:
        observation = _settled(env.reset(task))
    except Exception as exc:
        raise EnvFailure(ENV_ERROR, f"{type(env).__name__}.reset raised {exc!r}") from exc
    return check_observation(env, observation)


def _settled(out: Any) -> Any:
    """An `async def` environment's answer, awaited here (lockstep has no event loop of its own)."""
    return asyncio.run(_wait(out)) if inspect.isawaitable(out) else out


async def _wait(out: Any) -> Any:
    return await out


def is_observation(observation: Any) -> bool:
    """A str, or an `Observation` of a str and at most MAX_IMAGES images (PIL images or file bytes)."""
    if isinstance(observation, str):
        return True
    if not isinstance(observation, Observation) or not isinstance(observation.text, str):
        return False
    from PIL import Image

    images = observation.images
    return (isinstance(images, (list, tuple)) and len(images) <= MAX_IMAGES
            and all(isinstance(im, (Image.Image, bytes)) for im in images))


def check_observation(env: Environment, observation: Any) -> str | Observation:
    if not is_observation(observation):
        raise EnvFailure(ENV_ERROR, f"{type(env).__name__}.reset returned {observation!r:.60}, not a str or an "
                                    f"Observation(text, images) of at most {MAX_IMAGES} PIL images or image files")
    return observation


def checked_step(env: Environment, action: str, task: Task) -> tuple[str | Observation, float, bool, dict]:
    """`env.step(action)`, its failure an EnvFailure."""
    try:
        result = _settled(env.step(action))
    except Exception as exc:
        raise EnvFailure(ENV_ERROR, f"{type(env).__name__}.step raised {exc!r}") from exc
    return check_result(env, result, task)


def check_result(env: Environment, result: Any, task: Task) -> tuple[str | Observation, float, bool, dict]:
    """A step's result as (observation, reward, done, info), or an EnvFailure saying what is wrong."""
    try:
        observation, reward, done, info = result
        reward = float(reward)
        info = dict(info or {})
    except (TypeError, ValueError) as exc:
        raise EnvFailure(ENV_ERROR, f"{type(env).__name__}.step returned {result!r:.60} (task {task.task_id}): "
                                    f"not (observation, reward, done, info)") from exc
    if not math.isfinite(reward) or not is_observation(observation):
        raise EnvFailure(ENV_ERROR, f"{type(env).__name__}.step returned observation {observation!r:.40} and reward "
                                    f"{reward} (task {task.task_id}): the observation must be a str or an "
                                    f"Observation(text, images), the reward finite")
    return observation, reward, bool(done), info


def close_env(env: Environment) -> None:
    """Call the environment's `close()`, if it has one; its failure is logged, never raised."""
    close = getattr(env, "close", None)
    if close is None:
        return
    try:
        _settled(close())
    except Exception:
        log.warning("%s.close raised", type(env).__name__, exc_info=True)


def model_turn(e: Episode, completion, budget: int, max_new_tokens: int, tokenizer: Any,
               version: int | None = None) -> ModelTurn | None:
    """Append one model turn; the turn, when its action goes to the environment (None: the episode ended)."""
    ids, logprobs, text, reason = completion.token_ids, completion.logprobs, completion.text, completion.finish_reason
    if len(ids) > budget:  # generated for the longest budget of the batch: cut to this episode's own
        ids, logprobs, reason = ids[:budget], logprobs[:budget], MAX_TOTAL_TOKENS
        text = tokenizer.decode(ids, skip_special_tokens=True)
    elif reason == LENGTH and budget < max_new_tokens:
        reason = MAX_TOTAL_TOKENS  # the episode's budget stopped it, not the per-turn one
    turn = e.add_model_turn(ids, logprobs, text, reason, version)
    if reason != "stop":
        e.finish_reason = reason
        return None
    return turn


def answer(e: Episode, turn: ModelTurn, result: tuple[str | Observation, float, bool, dict], encoder: TurnEncoder,
           limits: TurnLimits, between: Shown | None = None) -> None:
    """The environment's (checked) answer to `turn`: end the episode, or append the tokens before the
    next turn (`between`: those already encoded, `encoder.next` of the observation)."""
    observation, reward, done, info = result
    turn.reward = reward
    e.env_info = info
    ids = turn.ids
    if done:
        e.finish_reason = ENV_DONE
    elif len(e.turns) >= limits.max_turns:
        e.finish_reason = MAX_TURNS
    else:
        if between is None:  # reason 'stop': ids end with the stop token
            between = shown(e.env, lambda: encoder.next(observation, stop_id=ids[-1]))
        if e.length + len(between.ids) >= limits.max_total_tokens:
            e.finish_reason = MAX_TOTAL_TOKENS  # no room left for a model token after the observation
        elif len(e.images) + len(between.images) > MAX_IMAGES:
            e.finish_reason = MAX_IMAGES_SHOWN
        else:
            e.show(between)
