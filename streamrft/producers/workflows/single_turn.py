"""Single-turn: `params.n` independent completions of each task's prompt, one engine call for the batch
(scheduled one by one, `EpisodeScheduler.sample` makes each task's call and `completion_group` its group).

Every token of a response is sampled, so no loss mask is needed (all 1). `encode_prompt` is how
every workflow (and the held-out eval) turns a task into prompt ids.
"""
from __future__ import annotations

from streamrft.engine.rollout.base import Completion, RolloutEngine, SamplingParams
from streamrft.schemas import RolloutGroup, Task, Trajectory, new_id


def encode_prompt(tokenizer, task: Task, chat: bool = False) -> list[int]:
    """The task's token ids: given, or the prompt as a user turn of the chat template, or plain."""
    if task.prompt_ids:
        return task.prompt_ids
    if chat:
        text = tokenizer.apply_chat_template([{"role": "user", "content": task.prompt}], tokenize=False,
                                             add_generation_prompt=True)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer(task.prompt)["input_ids"]


def completion_group(task: Task, prompt: list[int], completions: list[Completion], *, version: int, team: str,
                     producer_id: str = "") -> RolloutGroup:
    """The RolloutGroup of one task's completions, sampled by weights `version`."""
    gid = new_id()
    trajs = [Trajectory(group_id=gid, task_id=task.task_id, team=team, model_version=version,
                        prompt_ids=prompt, response_ids=c.token_ids, logprobs=[min(lp, 0.0) for lp in c.logprobs],
                        response_text=c.text, finish_reason=c.finish_reason)
             for c in completions]
    return RolloutGroup(group_id=gid, team=team, task=task, trajectories=trajs, producer_id=producer_id)


def single_turn(engine: RolloutEngine, tasks: list[Task], params: SamplingParams, *, version: int,
                team: str, producer_id: str = "", chat: bool = False) -> list[RolloutGroup]:
    """One RolloutGroup of `params.n` trajectories per task."""
    prompts = [encode_prompt(engine.tokenizer, t, chat) for t in tasks]
    outputs = engine.generate(prompts, params)
    return [completion_group(task, prompt, completions, version=version, team=team, producer_id=producer_id)
            for task, prompt, completions in zip(tasks, prompts, outputs)]
