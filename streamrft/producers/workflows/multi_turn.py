"""Multi-turn, concatenated: one trajectory per episode, every turn in one response.

`response_ids` = model turn + environment turn + model turn ..., exactly the ids the engine saw;
`loss_mask` is 1 on the model's sampled tokens and 0 on the environment's and the chat template's
(whose log-probs are 0.0). `env_reward` is the episode's total environment reward; `info` holds
`episode_id`, `turns`, `step_rewards` and the environment's last `env_info`. The n episodes of a
task form its RolloutGroup, as single-turn samples do. See `episodes.py` for the turn loop and limits.
"""
from __future__ import annotations

from typing import Callable

from streamrft.engine.rollout.base import RolloutEngine, SamplingParams
from streamrft.producers.envs.base import Environment
from streamrft.producers.workflows.episodes import Episode, TurnLimits, run_episodes
from streamrft.schemas import RolloutGroup, Task, Trajectory, new_id


def episode_info(e: Episode) -> dict:
    return {"episode_id": e.episode_id, "turns": len(e.turns), "step_rewards": [t.reward for t in e.turns],
            "env_info": e.env_info}


def multi_turn(engine: RolloutEngine, tasks: list[Task], params: SamplingParams, *, version: int, team: str,
               producer_id: str = "", chat: bool = False, env: Callable[[], Environment] | None = None,
               limits: TurnLimits = TurnLimits()) -> list[RolloutGroup]:
    """One RolloutGroup of `params.n` episode trajectories per task; `env` makes a fresh environment."""
    if env is None:
        raise ValueError("the multi_turn workflow needs an environment (explorer.env)")
    groups = []
    for task, episodes in zip(tasks, run_episodes(engine, tasks, params, env=env, limits=limits, chat=chat)):
        gid = new_id()
        trajs = [Trajectory(group_id=gid, task_id=task.task_id, team=team, model_version=version,
                            prompt_ids=e.prompt_ids, response_ids=e.response_ids, logprobs=e.logprobs,
                            loss_mask=e.loss_mask, env_reward=e.env_reward, finish_reason=e.finish_reason,
                            response_text=engine.tokenizer.decode(e.response_ids, skip_special_tokens=True),
                            info=episode_info(e))
                 for e in episodes]
        groups.append(RolloutGroup(group_id=gid, team=team, task=task, trajectories=trajs, producer_id=producer_id))
    return groups
