"""Multi-turn, concatenated: one trajectory per episode, every turn in one response.

`response_ids` = model turn + environment turn + model turn ..., exactly the ids the engine saw;
`loss_mask` is 1 on the model's sampled tokens and 0 on the environment's and the chat template's
(whose log-probs are 0.0). `env_reward` is the episode's total environment reward; `info` holds
`episode_id`, `turns`, `step_rewards` and the environment's last `env_info`; `images` the pictures
the task and the observations showed, in the order of their placeholders (which sit in the prompt
and, masked 0, in the response). The n episodes of a task form its RolloutGroup, as single-turn
samples do. See `episodes.py` for the turn loop and limits.
"""
from __future__ import annotations

from typing import Callable

from streamrft.engine.rollout.base import RolloutEngine, SamplingParams
from streamrft.producers.envs.base import Environment
from streamrft.producers.workflows.episodes import Episode, TurnLimits, kept_episodes, run_episodes
from streamrft.schemas import RolloutGroup, Task, Trajectory, new_id


def episode_info(e: Episode) -> dict:
    return {"episode_id": e.episode_id, "turns": len(e.turns), "step_rewards": [t.reward for t in e.turns],
            "env_info": e.env_info}


def versions(e: Episode, version: int) -> dict:
    """`model_version` (the oldest turn's: staleness counts from it) and, when the episode's turns
    were sampled by more than one version, `turn_versions`; `version` for an episode with no turn."""
    vs = [version if t.version is None else t.version for t in e.turns] or [version]
    return {"model_version": min(vs), "turn_versions": vs if len(set(vs)) > 1 else None}


def episode_group(tokenizer, task: Task, episodes: list[Episode], *, version: int, team: str, producer_id: str = "",
                  min_episodes: int | None = None, stats: dict | None = None) -> RolloutGroup | None:
    """The RolloutGroup of one task's finished episodes, one trajectory each; None when too many of
    them ended by their environment (`episodes.kept_episodes`)."""
    kept = kept_episodes(task, episodes, min_episodes, stats)
    if kept is None:
        return None
    gid = new_id()
    trajs = [Trajectory(group_id=gid, task_id=task.task_id, team=team, **versions(e, version),
                        prompt_ids=e.prompt_ids, response_ids=e.response_ids, logprobs=e.logprobs, images=e.images,
                        loss_mask=e.loss_mask, env_reward=e.env_reward, finish_reason=e.finish_reason,
                        response_text=tokenizer.decode(e.response_ids, skip_special_tokens=True),
                        info=episode_info(e))
             for e in kept]
    return RolloutGroup(group_id=gid, team=team, task=task, trajectories=trajs, producer_id=producer_id)


def multi_turn(engine: RolloutEngine, tasks: list[Task], params: SamplingParams, *, version: int, team: str,
               producer_id: str = "", chat: bool = False, env: Callable[[], Environment] | None = None,
               limits: TurnLimits = TurnLimits(), min_episodes: int | None = None,
               stats: dict | None = None, play: Callable = run_episodes) -> list[RolloutGroup]:
    """One RolloutGroup of `params.n` episode trajectories per task; `env` makes a fresh environment.
    A task whose episodes too often ended by their environment's error or timeout gives no group."""
    if env is None:
        raise ValueError("the multi_turn workflow needs an environment (explorer.env)")
    rows = play(engine, tasks, params, env=env, limits=limits, chat=chat, stats=stats)  # lockstep, or `scheduler.play_all`
    groups = [episode_group(engine.tokenizer, task, episodes, version=version, team=team, producer_id=producer_id,
                            min_episodes=min_episodes, stats=stats)
              for task, episodes in zip(tasks, rows)]
    return [g for g in groups if g is not None]
