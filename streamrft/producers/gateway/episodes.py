"""An episode's calls, as the gateway recorded them, assembled into trajectories.

Every call of an episode keeps what the engine saw and did: the prompt ids, the sampled ids, their
behaviour log-probs and the weight version. When every call's prompt extends the previous call's
prompt + sampled ids (compared on ids), the episode is one concatenated trajectory: the first
prompt, then each call's new prompt ids (mask 0, log-prob 0.0: the environment's, the tools', the
chat template's) and its sampled ids (mask 1, their log-probs), as the `multi_turn` workflow lays
out its own episodes. Otherwise it is step-wise: one trajectory per call, prompt = that call's
prompt, response = its sampled ids, as the `step_wise` workflow does. Images: a concatenated
trajectory names every image of its last call, in placeholder order; those a later call added (an
image observation) have their placeholders in the response, masked 0, as the `multi_turn`
workflow lays them out (stream ops check that none is trained).

Rewards: the episode's total (`reward`, or the sum of per-call `rewards`) is every trajectory's
`env_reward` (score it with the `env` reward term); per-call rewards go to `info.step_rewards`
(concatenated) or each step's `info.step_reward`. `model_version` is the oldest version among the
calls (the trainer's staleness rule then holds for every token), and `info.versions` lists each
call's own: log-probs stay each call's own, whatever weights served the next one.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from streamrft.schemas import RolloutGroup, Task, Trajectory


@dataclass
class Call:
    prompt_ids: list[int]
    ids: list[int]
    logprobs: list[float]
    version: int
    finish_reason: str
    images: list = field(default_factory=list)  # the ImageRefs whose placeholders prompt_ids holds


@dataclass
class Finish:
    """What `POST /v1/episodes/{id}/finish` said."""

    reward: float
    step_rewards: list[float] | None
    task_id: str | None = None
    answer: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    finish_reason: str | None = None


def extends(calls: list[Call]) -> bool:
    """Every call's prompt starts with the previous call's prompt + sampled ids."""
    for prev, call in zip(calls, calls[1:]):
        before = prev.prompt_ids + prev.ids
        if call.prompt_ids[: len(before)] != before:
            return False
    return True


def trajectories(episode_id: str, calls: list[Call], finish: Finish, tokenizer: Any, **common) -> list[Trajectory]:
    """The episode's trajectories (`common`: group_id, task_id, team)."""
    if not calls:
        raise ValueError(f"episode {episode_id} has no call")
    steps = finish.step_rewards if finish.step_rewards is not None else [0.0] * (len(calls) - 1) + [finish.reward]
    versions = [c.version for c in calls]
    last_reason = finish.finish_reason or calls[-1].finish_reason
    meta = {"metadata": finish.metadata} if finish.metadata else {}
    if extends(calls) and all(c.images[: len(p.images)] == p.images for p, c in zip(calls, calls[1:])):
        response, logprobs, mask = [], [], []
        for k, c in enumerate(calls):
            if k:
                gap = c.prompt_ids[len(calls[k - 1].prompt_ids) + len(calls[k - 1].ids):]
                response += gap
                logprobs += [0.0] * len(gap)
                mask += [0] * len(gap)
            response += c.ids
            logprobs += [min(lp, 0.0) for lp in c.logprobs]
            mask += [1] * len(c.ids)
        return [Trajectory(**common, model_version=min(versions), prompt_ids=calls[0].prompt_ids,
                           images=calls[-1].images,
                           response_ids=response, logprobs=logprobs, loss_mask=mask, env_reward=finish.reward,
                           response_text=tokenizer.decode(response, skip_special_tokens=True),
                           finish_reason=last_reason,
                           info={"episode_id": episode_id, "assembly": "concatenated", "turns": len(calls),
                                 "step_rewards": steps, "versions": versions, **meta})]
    last = len(calls) - 1
    return [Trajectory(**common, model_version=c.version, prompt_ids=c.prompt_ids, images=c.images, response_ids=c.ids,
                       logprobs=[min(lp, 0.0) for lp in c.logprobs], env_reward=finish.reward,
                       response_text=tokenizer.decode(c.ids, skip_special_tokens=True),
                       finish_reason=last_reason if k == last else c.finish_reason,
                       info={"episode_id": episode_id, "assembly": "step_wise", "step": k, "num_steps": last + 1,
                             "step_reward": steps[k], "versions": [c.version], **meta})
            for k, c in enumerate(calls)]


def build_group(group_id: str, team: str, episodes: list[tuple[str, list[Call], Finish]], tokenizer: Any,
                producer_id: str) -> RolloutGroup:
    """One RolloutGroup of finished episodes (id, calls, finish), in the order given."""
    first_calls, first = episodes[0][1], episodes[0][2]
    task = Task(task_id=first.task_id or group_id, answer=first.answer,
                prompt=tokenizer.decode(first_calls[0].prompt_ids, skip_special_tokens=True))
    trajs = [t for eid, calls, fin in episodes
             for t in trajectories(eid, calls, fin, tokenizer, group_id=group_id, task_id=task.task_id, team=team)]
    shown = first_calls[0].images  # the task's images: those every trajectory's prompt begins with
    if shown and all(t.images[: len(shown)] == shown for t in trajs):
        task.images = shown
    return RolloutGroup(group_id=group_id, team=team, task=task, trajectories=trajs, producer_id=producer_id)
