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
from streamrft.producers.envs import env_factory
from streamrft.producers.workflows.episodes import TurnLimits
from streamrft.producers.workflows.multi_turn import multi_turn
from streamrft.producers.workflows.single_turn import encode_prompt, single_turn
from streamrft.producers.workflows.step_wise import step_wise
from streamrft.schemas import RolloutGroup

Workflow = Callable[..., list[RolloutGroup]]

WORKFLOWS: dict[str, Workflow] = {
    "single_turn": single_turn,
    "multi_turn": multi_turn,
    "step_wise": step_wise,
}


def make_workflow(ex: ExplorerConfig) -> Workflow:
    """The workflow `ex` names, with its environment and limits bound (single-turn: as it is)."""
    # the algorithms' look-up (import_path wins over the name); its package imports torch, as explorers do anyway
    from streamrft.engine.algorithms.registry import resolve

    fn = resolve(WORKFLOWS, ex.workflow, ex.workflow_import_path)
    if fn is single_turn:
        return fn
    env = env_factory(ex.env.type, ex.env.import_path, ex.env.params) if ex.env is not None else None
    return functools.partial(fn, env=env, limits=TurnLimits(ex.max_turns, ex.max_total_tokens))


__all__ = ["TurnLimits", "WORKFLOWS", "Workflow", "encode_prompt", "make_workflow", "multi_turn", "single_turn",
           "step_wise"]
