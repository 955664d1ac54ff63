"""The trajectory viewer's data: recent experience groups, filtered, with tokens decoded by turn.

A response is cut into runs of equal `loss_mask`: a run of 1s is what the trainer trains on (the
model's turns), a run of 0s what it does not (environment / tool turns of a multi-turn episode).
Each run is decoded on its own with the run's tokenizer (`load_decoder`), so the page can show the
turns one after another and highlight the trained ones. Without a tokenizer the ids are shown.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

from streamrft.schemas import ExperienceGroup

log = logging.getLogger(__name__)

Decode = Callable[[list[int]], str]


def mask_runs(mask: list[int]) -> list[tuple[int, int, int]]:
    """(start, end, bit) of each maximal run of equal bits."""
    runs, start = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            runs.append((start, i, mask[start]))
            start = i
    return runs


def ids_text(ids: list[int]) -> str:
    """The fallback decoder: the ids themselves."""
    return "[" + " ".join(map(str, ids)) + "]"


def load_decoder(model_path: str | None) -> Decode:
    """The run's tokenizer's decode (special tokens kept: an EOS between turns is information),
    or `ids_text` when `model.path` is not on this machine."""
    files = ("tokenizer.json", "tokenizer_config.json")
    if not model_path or not any((Path(model_path) / f).exists() for f in files):
        log.warning("no tokenizer at model.path=%s: the trajectory viewer shows token ids", model_path)
        return ids_text
    from streamrft.engine.models import load_tokenizer

    tok = load_tokenizer(model_path)
    return lambda ids: tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def staleness_of(version_at_scoring: int | None, model_version: int) -> int | None:
    return None if version_at_scoring is None else max(version_at_scoring - model_version, 0)


def group_view(eg: ExperienceGroup, decode: Decode, where: tuple[str, int, int],
               version_at_scoring: int | None) -> dict:
    """One group as the page shows it: task, and per trajectory its reward terms, advantage,
    version, staleness and the prompt and response decoded turn by turn."""
    topic, partition, offset = where
    trajs = []
    for i, t in enumerate(eg.trajectories):
        mask = t.mask()
        trajs.append({
            "traj_id": t.traj_id, "reward": eg.rewards[i], "advantage": eg.advantages[i],
            "components": {k: v[i] for k, v in eg.reward_components.items() if i < len(v)},
            "version": t.model_version, "staleness": staleness_of(version_at_scoring, t.model_version),
            "finish_reason": t.finish_reason, "tokens": len(t.response_ids),
            "masked": len(mask) - sum(mask), "prompt": decode(t.prompt_ids),
            "turns": [{"trained": bool(bit), "text": decode(t.response_ids[a:b]), "tokens": b - a}
                      for a, b, bit in mask_runs(mask)],
        })
    return {"group_id": eg.group_id, "team": eg.team, "task_id": eg.task.task_id, "prompt": eg.task.prompt,
            "answer": eg.task.answer, "created_at": eg.created_at, "priority": eg.priority,
            "reward_mean": sum(eg.rewards) / len(eg.rewards), "topic": topic, "partition": partition,
            "offset": offset, "trajectories": trajs}


def matches(eg: ExperienceGroup, team: str | None, task: str | None, min_reward: float | None,
            max_reward: float | None) -> bool:
    """The viewer's filters: the team exactly, `task` as a substring of the task id or prompt, and the
    group's mean reward within [min_reward, max_reward]."""
    if team and eg.team != team:
        return False
    if task and task not in eg.task.task_id and task not in eg.task.prompt:
        return False
    mean = sum(eg.rewards) / len(eg.rewards)
    if min_reward is not None and mean < min_reward:
        return False
    return max_reward is None or mean <= max_reward
