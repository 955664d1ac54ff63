"""Single-turn: `params.n` independent completions of each task's prompt, one engine call for the batch
(scheduled one by one, `EpisodeScheduler.sample` makes each task's call and `completion_group` its group).

Every token of a response is sampled, so no loss mask is needed (all 1). `encode_prompt`
(`prompts.py`) is how every workflow (and the held-out eval) turns a task into prompt ids;
`prompt_of` adds a vision-language task's images.
"""
from __future__ import annotations

from streamrft.engine.rollout.base import Completion, RolloutEngine, SamplingParams
from streamrft.producers.workflows.prompts import encode_prompt, prompt_of
from streamrft.schemas import RolloutGroup, Task, Trajectory, new_id

__all__ = ["completion_group", "encode_prompt", "single_turn"]


def completion_group(task: Task, prompt: list[int], completions: list[Completion], *, version: int, team: str,
                     producer_id: str = "") -> RolloutGroup:
    """The RolloutGroup of one task's completions, sampled by weights `version`; each trajectory
    names the task's images, whose placeholders its prompt holds."""
    gid = new_id()
    trajs = [Trajectory(group_id=gid, task_id=task.task_id, team=team, model_version=version,
                        prompt_ids=prompt, response_ids=c.token_ids, logprobs=[min(lp, 0.0) for lp in c.logprobs],
                        response_text=c.text, finish_reason=c.finish_reason, images=task.images)
             for c in completions]
    return RolloutGroup(group_id=gid, team=team, task=task, trajectories=trajs, producer_id=producer_id)


def single_turn(engine: RolloutEngine, tasks: list[Task], params: SamplingParams, *, version: int,
                team: str, producer_id: str = "", chat: bool = False) -> list[RolloutGroup]:
    """One RolloutGroup of `params.n` trajectories per task."""
    prompts, images = zip(*(prompt_of(engine, t, chat) for t in tasks)) if tasks else ((), ())
    shown = {"images": [i or [] for i in images]} if any(images) else {}
    outputs = engine.generate(list(prompts), params, **shown)
    return [completion_group(task, prompt, completions, version=version, team=team, producer_id=producer_id)
            for task, prompt, completions in zip(tasks, prompts, outputs)]
