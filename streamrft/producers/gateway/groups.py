"""Open episodes and groups, from a group's first call to its acknowledged RolloutGroup.

Lives on the server's event loop (one thread: no locks); what blocks (the admission decision, the
publish and its delivery report) runs in worker threads. Life of a group:
- its first call opens it: admission control (`AdmissionLog.open_group`) decides, or 429;
- up to `size` episodes join it, each recording its calls (one at a time per episode);
- each episode is finished by its client with its reward, or expires idle (`episode_timeout_s`);
- when all `size` episodes are finished, the finish that completed it publishes the group and
  answers only once the broker acknowledged it; after `group_timeout_s`, or once every one of its
  `size` episodes finished or expired, the finished ones are published (none: the group is dropped);
- a published or dropped group's ids are remembered (bounded), so a late call or a repeated finish
  is answered from that memory and the group is never published twice.
A publish the broker did not acknowledge leaves the group complete: the sweep and a repeated
finish try again.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from streamrft.producers.gateway.episodes import Call, Finish, build_group
from streamrft.producers.gateway.prompts import LastCall
from streamrft.schemas import RolloutGroup, Task

log = logging.getLogger(__name__)

REMEMBERED = 100_000
"""Ids of ended episodes and groups kept to answer late requests (oldest forgotten first)."""


class GatewayError(Exception):
    """An OpenAI-shaped error answer."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None, retry_after: float | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type_, code, param
        self.retry_after = retry_after


@dataclass
class EpisodeState:
    episode_id: str
    group: "GroupState"
    calls: list[Call] = field(default_factory=list)
    last: LastCall | None = None
    finish: Finish | None = None
    busy: bool = False
    last_seen: float = field(default_factory=time.monotonic)


@dataclass
class GroupState:
    group_id: str
    team: str
    size: int
    version: int
    """The weights that served its first call (its admission)."""
    admitted: asyncio.Future
    started: float = field(default_factory=time.monotonic)
    episodes: dict[str, EpisodeState] = field(default_factory=dict)
    expired: int = 0
    publishing: asyncio.Task | None = None

    @property
    def finished(self) -> list[EpisodeState]:
        return [e for e in self.episodes.values() if e.finish is not None]

    @property
    def unfinished(self) -> list[EpisodeState]:
        return [e for e in self.episodes.values() if e.finish is None]


class Remembered(collections.OrderedDict):
    """A mapping that forgets its oldest entries beyond `limit`."""

    def __init__(self, limit: int = REMEMBERED):
        super().__init__()
        self.limit = limit

    def remember(self, key: Any, value: Any) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.limit:
            self.popitem(last=False)


class GroupStore:
    def __init__(self, *, tokenizer: Any, producer_id: str, default_size: int, group_timeout_s: float,
                 episode_timeout_s: float, max_open_episodes: int, open_group: Callable[[int], bool],
                 close_group: Callable[[int, bool], None], publish: Callable[[RolloutGroup], None]):
        self.tokenizer, self.producer_id, self.default_size = tokenizer, producer_id, default_size
        self.group_timeout_s, self.episode_timeout_s, self.max_open = group_timeout_s, episode_timeout_s, max_open_episodes
        self._open_group, self._close_group, self._publish_fn = open_group, close_group, publish
        # ids are each team's own: every map is keyed by (team, id), so one team's ids never answer,
        # block or finish another's
        self.groups: dict[tuple[str, str], GroupState] = {}
        self.episodes: dict[tuple[str, str], EpisodeState] = {}
        self.ended_episodes = Remembered()  # (team, episode_id) -> the answer of its finish, or why it ended
        self.ended_groups = Remembered()  # (team, group_id) -> "published" | "dropped"
        self.counters: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        # pools of their own: an admission decision waits on the broker while holding its thread, and
        # the loop's default pool (cores + 4 threads) would queue publishes and closes behind them
        self._deciding = concurrent.futures.ThreadPoolExecutor(64, thread_name_prefix="gateway-admission")
        self._io = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="gateway-publish")

    def close(self) -> None:
        self._deciding.shutdown(wait=False, cancel_futures=True)
        self._io.shutdown(wait=True)

    async def _in(self, pool: concurrent.futures.Executor, fn: Callable, *args) -> Any:
        return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)

    # ---- calls ------------------------------------------------------------------------------------
    async def episode(self, team: str, episode_id: str, group_id: str | None, size: int | None,
                      version: int) -> EpisodeState:
        """The open episode a call belongs to, opening it (and its group) on its first call."""
        ep = self.episodes.get((team, episode_id))
        if ep is not None:
            if group_id is not None and group_id != ep.group.group_id:
                raise GatewayError(400, f"episode {episode_id!r} is in group {ep.group.group_id!r}, not {group_id!r}",
                                   param="group_id")
            if ep.finish is not None:
                raise GatewayError(409, f"episode {episode_id!r} is finished", code="episode_finished")
            if ep.busy:
                raise GatewayError(409, f"episode {episode_id!r} has a call in progress: one call at a time per "
                                        "episode", code="episode_busy")
            return ep
        if (team, episode_id) in self.ended_episodes:
            raise GatewayError(409, f"episode {episode_id!r} is over ({self.ended_episodes[team, episode_id]['status']})",
                               code="episode_over")
        if len(self.episodes) >= self.max_open:
            self.counters[team]["rejected_open_episodes"] += 1
            raise GatewayError(429, f"{len(self.episodes)} episodes open, the most gateway.max_open_episodes allows",
                               type_="rate_limit_error", code="too_many_episodes", retry_after=1.0)
        gid = group_id or episode_id  # no group named: the episode is a group of its own
        group = await self._group(team, gid, size if group_id else 1, version)
        if len(group.episodes) + group.expired >= group.size:
            raise GatewayError(409, f"group {gid!r} already has its {group.size} episodes", code="group_full")
        ep = EpisodeState(episode_id, group)
        group.episodes[episode_id] = self.episodes[team, episode_id] = ep
        self.counters[team]["episodes_started"] += 1
        return ep

    async def _group(self, team: str, gid: str, size: int | None, version: int) -> GroupState:
        size = size or self.default_size
        g = self.groups.get((team, gid))
        if g is None:
            if (team, gid) in self.ended_groups:
                raise GatewayError(409, f"group {gid!r} is over ({self.ended_groups[team, gid]})", code="group_over")
            g = GroupState(gid, team, size, version, asyncio.get_running_loop().create_future())
            self.groups[team, gid] = g
            try:
                ok = await self._in(self._deciding, self._open_group, version)
            except Exception as e:
                log.warning("admission decision failed: %s: %s", type(e).__name__, e)
                ok = False
            g.admitted.set_result(ok)
            if not ok:
                del self.groups[team, gid]
        else:
            ok = await asyncio.shield(g.admitted)
        if not ok:
            self.counters[team]["rejected_admission"] += 1
            raise GatewayError(429, "admission control: the trainer is behind (a group started now would be trained "
                                    "staler than trainer.max_staleness); retry later", type_="rate_limit_error",
                               code="admission", retry_after=1.0)
        if size != g.size:
            raise GatewayError(400, f"group {gid!r} has size {g.size}, not {size}", param="group_size")
        if (team, gid) not in self.groups:
            raise GatewayError(409, f"group {gid!r} is over", code="group_over")
        return g

    def begin(self, ep: EpisodeState) -> None:
        ep.busy = True
        ep.last_seen = time.monotonic()

    def record(self, ep: EpisodeState, call: Call | None, last: LastCall | None) -> None:
        """The call ended (`call` None: it failed and is not part of the episode)."""
        ep.busy = False
        ep.last_seen = time.monotonic()
        if call is not None and (ep.group.team, ep.episode_id) in self.episodes:
            ep.calls.append(call)
            ep.last = last

    # ---- finish -----------------------------------------------------------------------------------
    async def finish(self, team: str, episode_id: str, body: dict) -> dict:
        ended = self.ended_episodes.get((team, episode_id))
        if ended is not None:
            return ended  # a repeated finish: the same answer
        ep = self.episodes.get((team, episode_id))
        if ep is None:
            raise GatewayError(404, f"no open episode {episode_id!r}", code="episode_not_found")
        g = ep.group
        if ep.finish is None:
            if ep.busy:
                raise GatewayError(409, f"episode {episode_id!r} has a call in progress", code="episode_busy")
            if not ep.calls:
                raise GatewayError(400, f"episode {episode_id!r} has no call to train on", code="empty_episode")
            ep.finish = self._parse_finish(body, len(ep.calls))
            others = {e.finish.task_id for e in g.finished if e is not ep}
            if others and ep.finish.task_id not in others:
                ep.finish = None
                raise GatewayError(400, f"task_id {body.get('task_id')!r} differs from the group's {sorted(others, key=str)}",
                                   param="task_id")
            ep.last_seen = time.monotonic()
            self.counters[team]["episodes_finished"] += 1
        if len(g.finished) == g.size:
            await self._publish(g)
        return self._answer(ep)

    def _answer(self, ep: EpisodeState) -> dict:
        g = ep.group
        key = (g.team, g.group_id)
        status = "pending" if key in self.groups else self.ended_groups.get(key, "pending")
        return {"episode_id": ep.episode_id, "group_id": g.group_id, "status": status,
                "finished": len(g.finished), "group_size": g.size}

    @staticmethod
    def _parse_finish(body: dict, calls: int) -> Finish:
        def number(v: Any, name: str) -> float:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise GatewayError(400, f"`{name}` must be a finite number", param=name)
            return float(v)

        unknown = set(body) - {"reward", "rewards", "task_id", "answer", "metadata", "finish_reason"}
        if unknown:
            raise GatewayError(400, f"unknown fields {sorted(unknown)}; allowed: reward, rewards, task_id, answer, "
                                    "metadata, finish_reason", param=sorted(unknown)[0])
        steps = body.get("rewards")
        if steps is not None:
            if not isinstance(steps, list) or len(steps) != calls:
                raise GatewayError(400, f"`rewards` must hold one reward per call of the episode ({calls})",
                                   param="rewards")
            steps = [number(v, "rewards") for v in steps]
        if "reward" not in body and steps is None:
            raise GatewayError(400, "a finish needs `reward` (the episode's) or `rewards` (one per call)", param="reward")
        reward = number(body["reward"], "reward") if "reward" in body else sum(steps)
        for name in ("task_id", "answer", "finish_reason"):
            v = body.get(name)
            if v is not None and (not isinstance(v, str) or not 0 < len(v) <= 256 and name != "answer"):
                raise GatewayError(400, f"`{name}` must be a string (1-256 characters)", param=name)
        meta = body.get("metadata") or {}
        try:
            Task(prompt="", metadata=meta)  # the wire's rules for free-form JSON
        except Exception as e:
            raise GatewayError(400, f"`metadata` must be a JSON object: {e}", param="metadata") from None
        return Finish(reward, steps, body.get("task_id"), body.get("answer"), meta, body.get("finish_reason"))

    async def _publish(self, g: GroupState) -> None:
        if g.publishing is None or g.publishing.done() and g.publishing.exception() is not None:
            g.publishing = asyncio.ensure_future(self._publish_now(g))
        await asyncio.shield(g.publishing)

    async def _publish_now(self, g: GroupState) -> None:
        finished = g.finished
        group = build_group(g.group_id, g.team, [(e.episode_id, e.calls, e.finish) for e in finished],
                            self.tokenizer, self.producer_id)
        try:
            await self._in(self._io, self._publish_fn, group)
        except Exception as e:
            self.counters[g.team]["publish_errors"] += 1
            log.warning("group %s not acknowledged (%s: %s); will retry", g.group_id, type(e).__name__, e)
            raise GatewayError(503, f"the broker did not acknowledge group {g.group_id}: retry the finish",
                               type_="server_error", code="not_acknowledged", retry_after=2.0) from None
        c = self.counters[g.team]
        c["groups_published"] += 1
        c["groups_partial"] += len(finished) < g.size
        c["trajectories"] += len(group.trajectories)
        self._end_group(g, "published")
        await self._in(self._io, self._close_group, g.version, True)

    def _end_group(self, g: GroupState, status: str) -> None:
        self.groups.pop((g.team, g.group_id), None)
        self.ended_groups.remember((g.team, g.group_id), status)
        for e in g.episodes.values():
            self.episodes.pop((g.team, e.episode_id), None)
            ans = {"episode_id": e.episode_id, "group_id": g.group_id, "finished": len(g.finished),
                   "group_size": g.size, "status": status if e.finish is not None else "expired"}
            self.ended_episodes.remember((g.team, e.episode_id), ans)

    # ---- the sweep ------------------------------------------------------------------------------
    async def sweep(self) -> None:
        """Expire idle episodes, settle timed-out or fully accounted groups, retry unacknowledged ones."""
        now = time.monotonic()
        for g in list(self.groups.values()):
            if not g.admitted.done() or not g.admitted.result():
                continue
            timed_out = now - g.started > self.group_timeout_s
            for e in g.unfinished:
                if not e.busy and (timed_out or now - e.last_seen > self.episode_timeout_s):
                    del g.episodes[e.episode_id]
                    self.episodes.pop((g.team, e.episode_id), None)
                    self.ended_episodes.remember((g.team, e.episode_id), {
                        "episode_id": e.episode_id, "group_id": g.group_id, "status": "expired"})
                    g.expired += 1
                    self.counters[g.team]["episodes_expired"] += 1
            accounted = len(g.episodes) + g.expired >= g.size
            if g.unfinished or not (timed_out or accounted):
                continue
            if g.finished:
                try:
                    await self._publish(g)
                except GatewayError:
                    pass  # retried at the next sweep
            else:
                self.counters[g.team]["groups_dropped"] += 1
                self._end_group(g, "dropped")
                await self._in(self._io, self._close_group, g.version, False)

    def open_counts(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = collections.defaultdict(lambda: {"open_groups": 0, "open_episodes": 0})
        for g in self.groups.values():
            out[g.team]["open_groups"] += 1
            out[g.team]["open_episodes"] += len(g.unfinished)
        return out
