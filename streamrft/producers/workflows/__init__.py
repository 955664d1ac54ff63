"""Workflows turn tasks into RolloutGroups with a rollout engine, chosen by `explorer.workflow`.

A workflow is `fn(engine, tasks, params, *, version, team, producer_id="", chat=False, ...)` ->
one RolloutGroup per task, `params.n` samples or episodes each; `make_workflow(cfg.explorer)` gives
the explorer one ready to call with exactly those arguments.
- `single_turn`: n completions of each prompt.
- `multi_turn`: n episodes in `explorer.env`, one concatenated trajectory each, `loss_mask` 0 on
  environment and template tokens.
- `step_wise`: the same episodes, one trajectory per model turn, each with the episode's reward.
Your own workflow (`explorer.workflow_import_path: "pkg.module:function"`) is called like the
multi-turn ones, also with `env` (a factory of fresh environments, None without `explorer.env`)
and `limits` (`TurnLimits`) as keywords; it returns RolloutGroups that pass `schemas.decode`.
"""
from __future__ import annotations

import functools
from typing import Callable

from streamrft.config import ExplorerConfig
from streamrft.producers.envs import EnvFactory, env_factory
from streamrft.producers.envs.latency import with_latency
from streamrft.producers.workflows.episodes import TurnLimits
from streamrft.producers.workflows.multi_turn import episode_group, multi_turn
from streamrft.producers.workflows.scheduler import play_all
from streamrft.producers.workflows.single_turn import encode_prompt, single_turn
from streamrft.producers.workflows.step_wise import step_wise, steps_group
from streamrft.schemas import RolloutGroup

Workflow = Callable[..., list[RolloutGroup]]

WORKFLOWS: dict[str, Workflow] = {
    "single_turn": single_turn,
    "multi_turn": multi_turn,
    "step_wise": step_wise,
}


def make_env(ex: ExplorerConfig) -> EnvFactory | None:
    """A factory of `explorer.env`'s environments, with `env.latency`'s delay when set (awaited when
    episodes are scheduled one by one, slept through in lockstep); None without `explorer.env`."""
    if ex.env is None:
        return None
    env = env_factory(ex.env.type, ex.env.import_path, ex.env.params)
    lat = ex.env.latency
    if lat is not None:
        env = with_latency(env, lat.median_s, lat.p99_s, lat.seed, asynchronous=ex.scheduling == "per_episode")
    return env


def make_workflow(ex: ExplorerConfig, stats: dict | None = None, min_episodes: int | None = None) -> Workflow:
    """The workflow `ex` names, with its environment and limits bound (single-turn: as it is). The
    shipped multi-turn ones also count environment failures in `stats` and keep a group while
    `min_episodes` of its episodes ended normally (None: `explorer.min_episodes_per_group`)."""
    # the algorithms' look-up (import_path wins over the name); its package imports torch, as explorers do anyway
    from streamrft.engine.algorithms.registry import resolve

    fn = resolve(WORKFLOWS, ex.workflow, ex.workflow_import_path)
    if fn is single_turn:
        return fn
    bound = {"env": make_env(ex), "limits": TurnLimits(ex.max_turns, ex.max_total_tokens)}
    if fn in (multi_turn, step_wise):
        bound.update(stats=stats, min_episodes=min_episodes or ex.min_episodes_per_group)
        if ex.scheduling == "per_episode":
            bound["play"] = functools.partial(play_all, env_threads=ex.env_threads,
                                              step_timeout_s=ex.env.step_timeout_s)
    return functools.partial(fn, **bound)


GROUP_BUILDERS = {multi_turn: episode_group, step_wise: steps_group}
"""How each shipped multi-turn workflow makes one task's group of finished episodes (the scheduler's)."""


__all__ = ["GROUP_BUILDERS", "TurnLimits", "WORKFLOWS", "Workflow", "encode_prompt", "make_env", "make_workflow",
           "multi_turn", "single_turn", "step_wise"]
