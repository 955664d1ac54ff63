"""The trajectory viewer's data: every group of the run, filtered and paged, with tokens decoded by turn.

A response is cut into runs of equal `loss_mask`: a run of 1s is what the trainer trains on (the
model's turns), a run of 0s what it does not (environment / tool turns of a multi-turn episode).
Each run is decoded on its own with the run's tokenizer (`load_decoder`: `model.path`, or the base
files in S3), so the page can show the turns one after another and highlight the trained ones.
Without a tokenizer the ids are shown.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable, NamedTuple

from streamrft.monitor.dashboard.state import GroupRow
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


def _decoder(path: str | Path) -> Decode:
    from streamrft.infra.tokenizer import load_tokenizer

    tok = load_tokenizer(path)  # read into memory: the directory may go afterwards
    return lambda ids: tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def load_decoder(model_path: str | None, store=None, weights_key: str | None = None) -> Decode | None:
    """The run's tokenizer's decode (special tokens kept: an EOS between turns is information): from
    `model.path`, else from the base files the run's newest version names in S3 (`store`; a run
    trained on another machine). None while neither has one (no version yet: ask again later);
    `ids_text` for a LoRA run away from its `model.path` (its base in S3 holds the base weights:
    too much to fetch for a tokenizer)."""
    if model_path and any((Path(model_path) / f).exists() for f in ("tokenizer.json", "tokenizer_config.json")):
        return _decoder(model_path)
    if store is None:
        return ids_text
    import tempfile

    version = store.latest_version(weights_key)
    if version is None:
        return None
    meta = store.read_manifest(weights_key, version).meta
    if "base" not in meta or meta.get("kind", "full") != "full":
        log.warning("no tokenizer at model.path=%s and none to fetch from S3: the viewer shows token ids", model_path)
        return ids_text
    with tempfile.TemporaryDirectory(prefix="streamrft-dashboard-") as tmp:
        store.fetch_base(meta["base"], meta["base_sha256"], Path(tmp))
        return _decoder(tmp)


def staleness_of(version_at_scoring: int | None, model_version: int) -> int | None:
    return None if version_at_scoring is None else max(version_at_scoring - model_version, 0)


def group_view(eg: ExperienceGroup, decode: Decode, where: tuple[str, int, int],
               version_at_scoring: int | None) -> dict:
    """One group as the page shows it: task, and per trajectory its reward terms, advantage,
    version, staleness, the images its prompt shows (references: the page fetches each from
    `/api/media/<sha256>`) and the prompt and response decoded turn by turn."""
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
            "images": [ref.model_dump(mode="json") for ref in t.images],
            "turns": [{"trained": bool(bit), "text": decode(t.response_ids[a:b]), "tokens": b - a}
                      for a, b, bit in mask_runs(mask)],
        })
    return {"group_id": eg.group_id, "team": eg.team, "task_id": eg.task.task_id, "prompt": eg.task.prompt,
            "answer": eg.task.answer, "created_at": eg.created_at, "priority": eg.priority,
            "reward_mean": sum(eg.rewards) / len(eg.rewards), "topic": topic, "partition": partition,
            "offset": offset, "trajectories": trajs}


class GroupQuery(NamedTuple):
    """The viewer's filters; None (or "") is no filter."""
    team: str | None = None
    task: str | None = None  # a substring of the task id or of its prompt
    min_reward: float | None = None  # the group's mean reward within [min_reward, max_reward]
    max_reward: float | None = None
    min_version: int | None = None  # the version that generated the group (its oldest trajectory's)
    max_version: int | None = None
    finish: str | None = None  # a finish reason one of its trajectories has


def row_matches(row: GroupRow, q: GroupQuery, prompts: dict[str, str]) -> bool:
    if q.team and row.team != q.team:
        return False
    if q.task and q.task not in row.task_id and q.task not in prompts.get(row.task_id, ""):
        return False
    if q.min_reward is not None and row.reward_mean < q.min_reward:
        return False
    if q.max_reward is not None and row.reward_mean > q.max_reward:
        return False
    if q.min_version is not None and row.version < q.min_version:
        return False
    if q.max_version is not None and row.version > q.max_version:
        return False
    return not q.finish or q.finish in row.finish


def select(index: list[GroupRow], prompts: dict[str, str], q: GroupQuery, before: int | None = None,
           limit: int = 20) -> tuple[list[GroupRow], int, int | None]:
    """One page of the groups matching `q`, newest first, read before the group numbered `before`
    (None: from the newest); with how many match in the whole run, and the cursor of the next
    (older) page, None on the last one."""
    matching = [r for r in reversed(index) if row_matches(r, q, prompts)]
    older = [r for r in matching if before is None or r.seq < before]
    page = older[:limit]
    return page, len(matching), (page[-1].seq if len(older) > limit else None)
