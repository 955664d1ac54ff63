"""Step-wise: every model turn is its own trajectory, for episodes longer than the context.

Step k's prompt is the episode's history before the turn (prompt, earlier model turns, environment
and template tokens, all as the engine saw them) and its response is the turn's sampled tokens
(mask all 1). Every step carries the episode's total `env_reward`, so stream ops score the steps
of an episode alike, and `info = {episode_id, step, num_steps, step_reward, episode_finish_reason,
env_info}`; the last step's `finish_reason` is the episode's, the others' their turn's ("stop").
The group of a task holds every step of its n episodes. An episode that ended before its first
turn (a prompt over `max_total_tokens`) gives one step with an empty response.
"""
from __future__ import annotations

from typing import Callable

from streamrft.engine.rollout.base import RolloutEngine, SamplingParams
from streamrft.producers.envs.base import Environment
from streamrft.producers.workflows.episodes import Episode, TurnLimits, kept_episodes, run_episodes
from streamrft.schemas import RolloutGroup, Task, Trajectory, new_id


def _info(e: Episode, step: int, num_steps: int, step_reward: float) -> dict:
    return {"episode_id": e.episode_id, "step": step, "num_steps": num_steps, "step_reward": step_reward,
            "episode_finish_reason": e.finish_reason, "env_info": e.env_info}


def _steps(e: Episode, version: int, **common) -> list[Trajectory]:
    if not e.turns:  # ended before its first turn: one empty step keeps the episode accounted for
        return [Trajectory(**common, model_version=version, prompt_ids=e.prompt_ids, response_ids=[], logprobs=[],
                           env_reward=e.env_reward, finish_reason=e.finish_reason, info=_info(e, 0, 1, 0.0))]
    last = len(e.turns) - 1
    return [Trajectory(**common, model_version=version if t.version is None else t.version,
                       prompt_ids=e.prompt_ids + e.response_ids[:t.start], response_ids=t.ids,
                       logprobs=t.logprobs, response_text=t.text, env_reward=e.env_reward,
                       finish_reason=e.finish_reason if k == last else t.finish_reason,
                       info=_info(e, k, last + 1, t.reward))
            for k, t in enumerate(e.turns)]


def steps_group(tokenizer, task: Task, episodes: list[Episode], *, version: int, team: str, producer_id: str = "",
                min_episodes: int | None = None, stats: dict | None = None) -> RolloutGroup | None:
    """The RolloutGroup of every step of one task's finished episodes, in episode order; None when
    too many of them ended by their environment (`episodes.kept_episodes`). A step's
    `model_version` is the version that sampled its turn."""
    kept = kept_episodes(task, episodes, min_episodes, stats)
    if kept is None:
        return None
    gid = new_id()
    trajs = [t for e in kept for t in _steps(e, version, group_id=gid, task_id=task.task_id, team=team)]
    return RolloutGroup(group_id=gid, team=team, task=task, trajectories=trajs, producer_id=producer_id)


def step_wise(engine: RolloutEngine, tasks: list[Task], params: SamplingParams, *, version: int, team: str,
              producer_id: str = "", chat: bool = False, env: Callable[[], Environment] | None = None,
              limits: TurnLimits = TurnLimits(), min_episodes: int | None = None,
              stats: dict | None = None, play: Callable = run_episodes) -> list[RolloutGroup]:
    """One RolloutGroup per task holding every step of its `params.n` episodes, in episode order."""
    if env is None:
        raise ValueError("the step_wise workflow needs an environment (explorer.env)")
    rows = play(engine, tasks, params, env=env, limits=limits, chat=chat, stats=stats)  # lockstep, or `scheduler.play_all`
    groups = [steps_group(engine.tokenizer, task, episodes, version=version, team=team, producer_id=producer_id,
                          min_episodes=min_episodes, stats=stats)
              for task, episodes in zip(tasks, rows)]
    return [g for g in groups if g is not None]
