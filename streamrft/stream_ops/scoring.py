"""Scoring one RolloutGroup: rewards, group-relative advantages, the zero-variance filter, a priority.

`score_group` is pure; `build_scorer(cfg)` resolves the config's names once and returns a
`group -> ExperienceGroup | None` function. A trajectory's reward is the weighted sum of the
configured terms (`stream_ops.rewards`), each kept in `reward_components[term]`. A term named
`env` (no `import_path`) is not a function: it reads the trajectory's `env_reward`, the reward an
environment producer attached; a trajectory without one makes the group a dead letter.
Advantages come from `algorithm.advantage` (default: the algorithm preset's, grpo ->
(r - mean) / (std + eps)) applied to the group's rewards; in a step_wise group (trajectories tagged
`info.episode_id`) to one reward per episode, broadcast back to its steps (see `score_group`).
Batch- and token-level advantages (reinforce_pp, gae, opd) need more than one group: stream ops
then sends zeros, the trainer
computes them, and the zero-variance filter is off (it only makes sense under group baselines).
Any exception in a user's reward or advantage becomes `ScoringError` naming the term and trajectory,
and so does a non-finite value anywhere on the way (a term, a weighted total, an advantage, the priority):
finite inputs can still overflow (1e308 * 2), and a NaN must never reach the trainer.
Slow terms (async or blocking rewards: model judges, sandboxes) are run by `slow_terms` with their
timeouts, retries and fallback: `await Scorer.ascore(group)` in the worker's event loop, where many
groups score at once; `Scorer(group)` and `score_group` also run them where no event loop runs.
"""
from __future__ import annotations

import asyncio
import json
import math
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import Any, Callable, NamedTuple

from streamrft.config import RunConfig
from streamrft.schemas import ExperienceGroup, RolloutGroup
from streamrft.stream_ops.errors import ScoringError
from streamrft.stream_ops.rewards.kinds import ResolvedReward

ENV_TERM = "env"
FEEDBACK_TERM = "feedback"
"""Not a function either: the ratings' aggregate, handed in by the feedback join (`feedback=`)."""
# advantage functions that take one group's rewards alone (see engine/algorithms/advantages.py)
GROUP_ADVANTAGES = ("grpo", "dr_grpo", "rloo", "opmd")
PRIORITIES = ("fifo", "reward_std", "abs_advantage")


def _term_value(term: ResolvedReward, group: RolloutGroup, i: int) -> float:
    traj = group.trajectories[i]
    if term.fn is None:
        if traj.env_reward is None:
            raise ScoringError(f"reward term {term.name!r}: trajectory {traj.traj_id} has no env_reward")
        value = float(traj.env_reward)
        if not math.isfinite(value):
            raise ScoringError(f"reward term {term.name!r}: trajectory {traj.traj_id} has env_reward {value}")
        return value
    try:
        given = {"task": group.task, "trajectory": traj}
        value = float(term.fn(traj.response_text, group.task.answer, **term.params,
                              **{name: given[name] for name in term.context}))
    except Exception as e:  # a user's reward can raise anything; it must not stop the stream
        raise ScoringError(f"reward term {term.name!r} raised on trajectory {traj.traj_id}: {_describe(e)}",
                           type(e).__name__) from e
    if not math.isfinite(value):
        raise ScoringError(f"reward term {term.name!r} returned {value} on trajectory {traj.traj_id}")
    return value


def _is_feedback(term: ResolvedReward) -> bool:
    return term.fn is None and term.name == FEEDBACK_TERM


def _feedback_values(group: RolloutGroup, feedback: "dict[str, float] | str | None",
                     components: dict[str, list[float]]) -> list[float]:
    if feedback is None:
        raise ScoringError(f"reward term {FEEDBACK_TERM!r}: group {group.group_id} came without its ratings (the "
                           "feedback join scores groups with this term)")
    if isinstance(feedback, str):  # on_timeout: fallback
        if feedback not in components:
            raise ScoringError(f"reward term {FEEDBACK_TERM!r}: its fallback term {feedback!r} is not configured")
        return list(components[feedback])
    missing = [t.traj_id for t in group.trajectories if t.traj_id not in feedback]
    if missing:
        raise ScoringError(f"reward term {FEEDBACK_TERM!r}: no rating for trajectory {missing[0]}")
    values = [float(feedback[t.traj_id]) for t in group.trajectories]
    if not all(math.isfinite(v) for v in values):
        raise ScoringError(f"reward term {FEEDBACK_TERM!r}: ratings aggregate to {values}")
    return values


def _describe(e: Exception) -> str:
    try:
        return f"{type(e).__name__}: {e}"
    except Exception:  # a user's exception class whose __str__ raises
        return f"{type(e).__name__} (unprintable)"


def _std(values: list[float]) -> float:
    """Population std (a group of one has 0); inf, never OverflowError, when the values are huge."""
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) * (v - mean) for v in values) / len(values))  # `**` raises on overflow


def _advantages(advantage_fn: Callable | None, params: dict, rewards: list[float]) -> list[float]:
    if advantage_fn is None:
        return [0.0] * len(rewards)
    try:
        out = advantage_fn(rewards, **params)
        adv = [float(a) for a in (out.tolist() if hasattr(out, "tolist") else out)]
    except Exception as e:  # a user's advantage function (import_path) can raise anything
        raise ScoringError(f"advantage function raised: {_describe(e)}", type(e).__name__) from e
    if len(adv) != len(rewards) or not all(math.isfinite(a) for a in adv):
        raise ScoringError(f"advantage function returned {adv} for rewards {rewards}")
    return adv


def group_priority(priority: str, rewards: list[float], advantages: list[float]) -> float:
    """fifo -> 0 (order comes from the log), reward_std -> population std, abs_advantage -> mean |A|."""
    if priority == "fifo":
        return 0.0
    if priority == "reward_std":
        return _std(rewards)
    if priority == "abs_advantage":
        return sum(abs(a) for a in advantages) / len(advantages)
    raise ValueError(f"unknown priority {priority!r}; allowed: {list(PRIORITIES)}")


def _episode_index(group: RolloutGroup) -> list[int] | None:
    """Trajectory i's episode, numbered in order of first appearance; None when no trajectory has an episode id.

    A step_wise group holds several trajectories (steps) per episode, tagged `info["episode_id"]`;
    a group in which only some trajectories are tagged is an error.
    """
    ids = [t.info.get("episode_id") for t in group.trajectories]
    if all(i is None for i in ids):
        return None
    if any(i is None for i in ids):
        raise ScoringError(f"group {group.group_id}: some trajectories carry info.episode_id and some do not")
    number: dict[Any, int] = {}
    return [number.setdefault(i, len(number)) for i in ids]


def _episode_rewards(group: RolloutGroup, totals: list[float], episode: list[int]) -> list[float]:
    """One reward per episode; every step of an episode must score alike (as `env`, the episode's reward, does)."""
    out: dict[int, float] = {}
    for i, (e, r) in enumerate(zip(episode, totals)):
        if e in out and not math.isclose(out[e], r, rel_tol=1e-9, abs_tol=1e-12):
            raise ScoringError(f"steps of episode {group.trajectories[i].info['episode_id']} score differently "
                               f"({out[e]} and {r} on trajectory {group.trajectories[i].traj_id}): step-wise "
                               f"rewards must be the episode's (e.g. the `env` term)")
        out.setdefault(e, r)
    return [out[e] for e in range(len(out))]


def score_group(group: RolloutGroup, rewards: list[ResolvedReward], advantage_fn: Callable | None,
                advantage_params: dict, drop_zero_variance: bool, priority: str,
                slow_values: dict[str, list[float]] | None = None,
                feedback: "dict[str, float] | str | None" = None) -> ExperienceGroup | None:
    """Score one group; None when its rewards are all equal and `drop_zero_variance` is on.
    (`score_group_outcome` keeps a filtered group's episode rewards too.)"""
    return score_group_outcome(group, rewards, advantage_fn, advantage_params, drop_zero_variance, priority,
                               slow_values, feedback).experience


class Scored(NamedTuple):
    """A scored group: its experience (None when filtered) and one reward per episode, which the
    task-stats topic carries for filtered groups too (all solved or all failed: what task selection needs)."""

    experience: ExperienceGroup | None
    episode_rewards: list[float]


def score_group_outcome(group: RolloutGroup, rewards: list[ResolvedReward], advantage_fn: Callable | None,
                        advantage_params: dict, drop_zero_variance: bool, priority: str,
                        slow_values: dict[str, list[float]] | None = None,
                        feedback: "dict[str, float] | str | None" = None) -> Scored:
    """Score one group: its experience, None when its rewards are all equal and `drop_zero_variance`
    is on, and its episode rewards either way.

    `slow_values`: each slow term's values, computed beforehand (`slow_terms.slow_components`);
    when not given, they are computed here in a private event loop (never call this inside one then).
    `feedback`: the `feedback` term's value of each trajectory by `traj_id` (the feedback join's
    aggregate of its ratings), or the label of another term whose values stand in (`on_timeout:
    fallback`); a group with a feedback term and no `feedback` is an error.
    Episodes of several steps (step_wise): the advantage function, the zero-variance filter and the
    priority see one reward per episode, and each step gets its episode's advantage, so an episode
    with more steps does not weigh more in the group's baseline.
    """
    n = len(group.trajectories)
    if slow_values is None and any(term.slow for term in rewards):
        from streamrft.stream_ops.slow_terms import slow_components

        slow_values = asyncio.run(slow_components(group, [t for t in rewards if t.slow]))
    components = {term.name: (slow_values[term.name] if term.slow else [_term_value(term, group, i) for i in range(n)])
                  for term in rewards if not _is_feedback(term)}
    for term in filter(_is_feedback, rewards):
        components[term.name] = _feedback_values(group, feedback, components)
    components = {term.name: components[term.name] for term in rewards}  # the config's order
    totals = [sum(term.weight * components[term.name][i] for term in rewards) for i in range(n)]
    if not all(math.isfinite(t) for t in totals):
        raise ScoringError(f"weighted rewards overflow: {totals} from {components}")
    episode = _episode_index(group) or list(range(n))
    episode_rewards = _episode_rewards(group, totals, episode)
    if drop_zero_variance and max(episode_rewards) - min(episode_rewards) <= 1e-12:
        return Scored(None, episode_rewards)
    episode_advantages = _advantages(advantage_fn, advantage_params, episode_rewards)
    # broadcast by index rather than engine.algorithms.broadcast_to_steps: no tensor, and steps need not be contiguous
    advantages = [episode_advantages[e] for e in episode]
    prio = group_priority(priority, episode_rewards, episode_advantages)
    if not math.isfinite(prio):
        raise ScoringError(f"priority {priority!r} is {prio} for rewards {totals}")
    return Scored(ExperienceGroup(
        group_id=group.group_id, team=group.team, task=group.task, trajectories=group.trajectories,
        rewards=totals, advantages=advantages, reward_components=components, priority=prio,
    ), episode_rewards)


@lru_cache(maxsize=None)
def _built(name: str | None, import_path: str | None, params_json: str) -> Callable[..., float]:
    """A factory reward built once per process for its params: a model loads once per worker, however
    many scorers (or evals) resolve the same term. What it returns must be safe to share (read-only)."""
    from streamrft.stream_ops.rewards import resolve_reward

    return resolve_reward(name, import_path)(**json.loads(params_json))


def resolve_rewards(cfg: RunConfig, terms=None) -> list[ResolvedReward]:
    """The config's reward terms (or `terms`, e.g. `eval.rewards`), looked up once (factories
    built); labels are unique (`#2`, ...)."""
    from streamrft.stream_ops.rewards import is_factory, resolve_reward

    resolved: list[ResolvedReward] = []
    seen: dict[str, int] = {}
    for term in cfg.stream_ops.rewards if terms is None else terms:
        label = term.import_path or term.name or ""
        seen[label] = seen.get(label, 0) + 1
        if seen[label] > 1:
            label = f"{label}#{seen[label]}"
        fn = None if (term.name in (ENV_TERM, FEEDBACK_TERM) and not term.import_path) \
            else resolve_reward(term.name, term.import_path)
        params = dict(term.params)
        if fn is not None and is_factory(fn):
            fn, params = _built(term.name, term.import_path, json.dumps(params, sort_keys=True)), {}
        resolved.append(ResolvedReward(label, fn, term.weight, params, timeout_s=term.timeout_s, retries=term.retries,
                                       backoff_s=term.backoff_s, fallback=term.fallback))
    if not resolved:
        raise ValueError("stream_ops.rewards is empty: configure at least one reward term")
    return resolved


def resolve_advantage(cfg: RunConfig) -> tuple[Callable | None, dict]:
    """The group advantage function and its params; None when the trainer must compute advantages."""
    from streamrft.engine.algorithms import ADVANTAGES, PRESETS, resolve

    part = cfg.algorithm.advantage
    if part.import_path:
        return resolve(ADVANTAGES, None, part.import_path), dict(part.params)
    name = part.type or PRESETS[cfg.algorithm.type]["advantage"]
    if name not in GROUP_ADVANTAGES:
        return None, {}
    return resolve(ADVANTAGES, name), dict(part.params)


class Scorer:
    """The worker's scorer: `await scorer.ascore(group)` inside an event loop (slow terms run
    concurrently, blocking ones in this scorer's thread pool), `scorer(group)` outside one.

    `stats["fallbacks"]` counts trajectories scored with a term's fallback value. With `with_rewards`
    it returns a `Scored` (stream ops: the task-stats topic needs a filtered group's rewards too).
    """

    def __init__(self, rewards: list[ResolvedReward], advantage_fn: Callable | None, advantage_params: dict,
                 drop_zero_variance: bool, priority: str, threads: int = 32, with_rewards: bool = False,
                 cleaning=None, images=None):
        self.with_rewards = with_rewards
        self.images = images  # `stream_ops.images.ImageCheck`: a group's images, checked first; None: not checked
        self.cleaning = cleaning  # stream_ops.ops (`ops.Cleaning`), run before scoring; None: no ops
        self.rewards, self.advantage_fn, self.advantage_params = rewards, advantage_fn, advantage_params
        self.drop, self.priority = drop_zero_variance, priority
        self.slow = [t for t in rewards if t.slow]
        self.stats = {"fallbacks": 0}
        self.pool = (ThreadPoolExecutor(threads, thread_name_prefix="reward")
                     if any(t.kind == "blocking" for t in rewards) else None)

    def _score(self, group: RolloutGroup, slow_values: dict | None, dropped: dict,
               feedback=None) -> ExperienceGroup | None | Scored:
        scored = score_group_outcome(group, self.rewards, self.advantage_fn, self.advantage_params, self.drop,
                                     self.priority, slow_values, feedback)
        if scored.experience is not None and dropped:
            scored.experience.dropped = dropped  # what the cleaning ops took out, and why
        return scored if self.with_rewards else scored.experience

    def _clean(self, group: RolloutGroup) -> tuple[RolloutGroup | None, dict]:
        return self.cleaning.apply(group) if self.cleaning is not None else (group, {})

    @property
    def parks(self) -> bool:
        """Groups wait for their ratings: a `feedback` term is configured (the join scores them)."""
        return any(_is_feedback(t) for t in self.rewards)

    async def ascore(self, group: RolloutGroup, feedback=None) -> ExperienceGroup | None | Scored:
        """`feedback`: the feedback term's values (`score_group_outcome`)."""
        from streamrft.stream_ops.slow_terms import slow_components

        if self.images is not None and (group.task.images or any(t.images for t in group.trajectories)):
            await asyncio.to_thread(self.images, group)  # S3 reads on a cache miss: off the event loop
        group, dropped = self._clean(group)
        if group is None:  # the ops left fewer than 2 trajectories: filtered, no task outcome
            return None
        slow = await slow_components(group, self.slow, self.pool, self.stats) if self.slow else {}
        return self._score(group, slow, dropped, feedback)

    def __call__(self, group: RolloutGroup, feedback=None) -> ExperienceGroup | None | Scored:
        if self.slow:
            return asyncio.run(self.ascore(group, feedback))
        if self.images is not None:
            self.images(group)
        group, dropped = self._clean(group)
        return None if group is None else self._score(group, {}, dropped, feedback)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)


def build_scorer(cfg: RunConfig, with_rewards: bool = False) -> Scorer:
    """Resolve rewards and advantage once; the returned scorer scores one group (with `with_rewards`,
    into a `Scored`: what stream ops need for the task-stats topic)."""
    advantage_fn, params = resolve_advantage(cfg)
    drop = cfg.stream_ops.drop_zero_variance and advantage_fn is not None
    cleaning = None
    if cfg.stream_ops.ops:  # stream_ops.ops: drop trajectories or dead-letter the record before scoring
        from streamrft.stream_ops.ops import build_cleaning

        cleaning = build_cleaning(cfg)
    images = None
    if with_rewards:  # the stream-ops worker's scorer: it checks what the trainer will read
        from streamrft.stream_ops.images import image_check

        images = image_check(cfg)
    return Scorer(resolve_rewards(cfg), advantage_fn, params, drop, cfg.stream_ops.priority, cfg.stream_ops.threads,
                  with_rewards, cleaning, images)
