"""An explorer whose episodes never wait for each other (`explorer.scheduling: per_episode`).

Single-turn groups go the same way: each is one request of n completions, sampled in whatever
engine call is next, together with the other groups ready by then.

The explorer's loop runs on an event loop around an `EpisodeScheduler` (`workflows/scheduler.py`),
which feeds the engine whatever episodes are ready for a model turn. Around it:

- **Admission, one group at a time, ahead of need.** While `max_concurrent_episodes` leaves room
  for another group and this explorer's share of the run's headroom, less its own open groups,
  allows it, a group is opened
  (`AdmissionLog.open_group`, as the gateway does: requests made together share one reservation
  record). The round trip runs in a thread beside the engine, so it never stalls generation.
- **A group goes out as soon as its n episodes have ended**, whatever the others do
  (`explorer.publish_order: finished`), or once the groups this explorer admitted before it have
  gone out, waiting `publish_wait_s` at most (`admitted`, `release_order.py`), with a
  delivery callback: its admission slot closes when the broker has acknowledged it. A delivery that
  failed for a transient reason is sent again (`CheckedProducer.serve`); one refused for itself
  raises. Episodes its environment ended are left out of the group, or the group is dropped
  (`explorer.min_episodes_per_group`), and counted.
- **Weights** swap before any engine call (`explorer.swap: between_turns`; each turn records the
  version that sampled it), or once the episodes in flight have ended (`between_batches`:
  admission pauses while a new version waits).
- **The eval** runs in the engine's thread, between two engine calls.
- **Stop**: the groups in flight are abandoned and their admission slots released. A group is one
  record, so nothing is ever half-published; a kill -9 leaves the slots to the lease.

Stages (the `profile:` line) are the engine's time: `generate` (in `engine.generate`), `env`
(nothing to generate while environment calls are in flight), `reserve` (nothing to generate while
groups wait for their admission decision), `admission_wait` (nothing in flight: the run's headroom
holds new groups back, the trainer sets the pace), `load`, `eval`. Admission round trips and publishing run beside the engine:
their busy seconds are `reserve_busy_s` and `publish_busy_s`.
"""
from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from streamrft.engine.algorithms.offpolicy import LENGTH_BUCKETS, length_bucket, model_turns
from streamrft.infra.kafka import flush_or_raise
from streamrft.producers.admission import explorer_share
from streamrft.producers.release_order import ReleaseOrder
from streamrft.producers.workflows import GROUP_BUILDERS, WORKFLOWS, TurnLimits, make_env, single_turn
from streamrft.producers.workflows.scheduler import EpisodeScheduler
from streamrft.producers.workflows.single_turn import completion_group
from streamrft.schemas import RolloutGroup, encode

log = logging.getLogger(__name__)


class EpisodeLoop:
    def __init__(self, explorer: Any, run: Any):
        """`explorer`: the `explorer.Explorer` whose loop this is; `run`: its `_Run` (this module is
        imported by explorer.py, never the other way)."""
        self.x, self.run_state = explorer, run
        ex = explorer.cfg.explorer
        self.n = ex.group_size
        workflow = WORKFLOWS[ex.workflow]
        self.builder = None if workflow is single_turn else GROUP_BUILDERS[workflow]  # None: completions
        self.groups: set[asyncio.Task] = set()
        self.opening = 0  # groups whose admission is being decided, or whose task is being taken
        self.backing_off = 0  # groups refused a moment ago, waiting before the next try
        self.failures: list[BaseException] = []
        self.busy = {"reserve_busy_s": 0.0, "publish_busy_s": 0.0}
        self.unacked = 0
        ex = explorer.cfg.explorer
        self.order = ReleaseOrder(ex.publish_wait_s if ex.publish_order == "admitted" else None)
        # episodes published, by length: what the trainer's batches are compared with (`length_mix`)
        self.lengths = dict.fromkeys(LENGTH_BUCKETS, 0)

    def run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        x, ex = self.x, self.x.cfg.explorer
        self.sched = sched = EpisodeScheduler(
            x.engine, x.params, env=make_env(ex), limits=TurnLimits(ex.max_turns, ex.max_total_tokens),
            chat=ex.chat_template, env_threads=ex.env_threads,
            step_timeout_s=60.0 if ex.env is None else ex.env.step_timeout_s,
            before_generate=x.swap if ex.swap == "between_turns" else None, max_rows=ex.engine.max_batch,
            opening=lambda: self.opening)
        # admission decisions made together share a reservation record: threads enough for a round of them
        self.deciding = ThreadPoolExecutor(max(1, ex.max_concurrent_episodes // self.n), thread_name_prefix="admission")
        self.io = ThreadPoolExecutor(1, thread_name_prefix="tasks")  # task sources are read by one thread
        sched.start()
        try:
            await self._loop()
        finally:
            for g in self.groups:
                g.cancel()
            await asyncio.gather(*self.groups, return_exceptions=True)
            await sched.close()
            self._release(everything=True)  # finished groups are whole: they go out, in order
            self.deciding.shutdown(wait=True)
            self.io.shutdown(wait=True)
            # every acknowledgement comes back while the admission log still runs (it closes the slots)
            await asyncio.get_running_loop().run_in_executor(None, flush_or_raise, x.producer)
            self._stages()

    async def _loop(self) -> None:
        x, ex, run = self.x, self.x.cfg.explorer, self.run_state
        generated = dropped = 0
        while not x.stop.is_set():
            x.producer.serve()  # delivery callbacks: acknowledged groups close their admission slots
            self._release()
            if self.failures:
                raise self.failures[0]
            if self.sched.failed is not None:
                raise RuntimeError("the rollout engine failed") from self.sched.failed
            run.check_reader()
            self._progress(generated, dropped)
            if ex.max_groups is not None and x.stats["groups"] + self.unacked + self.order.held() >= ex.max_groups:
                if not self.groups and not self.unacked and not self.order.held():
                    break
                await asyncio.sleep(0.01)
                continue
            if x.watcher.has_ready:
                if ex.swap == "between_batches" and (self.groups or self.opening):
                    await asyncio.sleep(0.01)  # the episodes in flight end first; nothing new starts
                    continue
                if not self.sched.episodes_in_flight or ex.swap == "between_batches":
                    # nothing is generating, so no engine call would swap: the explorer does, or it
                    # would keep asking admission for groups with weights too stale to be granted
                    await self.sched.on_engine(x.swap)
            slots = x.ready_slots()
            if slots is None:
                await asyncio.sleep(0.2)
                continue
            if x.eval_due(run.evaluated, slots):
                await self.sched.on_engine(x._maybe_eval, run.evaluated, slots)
            free = ((ex.max_concurrent_episodes - self.sched.episodes_in_flight) // self.n - self.opening
                    - self.backing_off)
            if free <= 0:
                await asyncio.sleep(0.005)
                continue
            generated, dropped, oldest = x.admission.counts()
            share = explorer_share(x.room()(generated, dropped, oldest), slots, x.members.num_slots)
            # the counts leave out this process's own open groups: they already take part of its share,
            # and asking for more would only earn a refusal a round trip later
            k = min(free, share - x.admission.in_flight)
            if k <= 0:
                x.stats["admission_waits"] += 1
                await asyncio.sleep(0.05)
                continue
            for _ in range(k):
                task = asyncio.get_running_loop().create_task(self._group(slots))
                self.groups.add(task)
                task.add_done_callback(self._group_done)
            await asyncio.sleep(0)  # let them start deciding before the next count

    def _group_done(self, task: asyncio.Task) -> None:
        self.groups.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.failures.append(task.exception())

    async def _group(self, slots: frozenset[int]) -> None:
        """Open one group, play its task's n episodes, publish it."""
        x, ex, loop = self.x, self.x.cfg.explorer, asyncio.get_running_loop()
        version, ok = x.engine.version, False
        self.opening += 1
        try:
            t0 = time.monotonic()
            ok = await loop.run_in_executor(self.deciding, x.admission.open_group, version, x.room())
            self.busy["reserve_busy_s"] += time.monotonic() - t0
            if ok:
                batch = await loop.run_in_executor(self.io, self.run_state.tasks.take, 1, slots, x.members.num_slots)
        finally:
            self.opening -= 1
        if not ok:  # the run's headroom is full: this slot of the loop waits before another try
            x.stats["admission_waits"] += 1
            self.backing_off += 1
            try:
                await asyncio.sleep(0.05)
            finally:
                self.backing_off -= 1
            return
        if not batch:  # our slots hold no task (tiny file), or the tasks topic is dry
            x.admission.close_group(version, False)
            await asyncio.sleep(0.2)
            return
        published, seq = False, self.order.admit()
        seed = (x.group_seeds(batch) or [None])[0]
        try:
            if self.builder is None:  # single-turn: n completions of one prompt, in one engine call
                prompt, completions, sampled = await self.sched.sample(batch[0], self.n, seed)
                group = completion_group(batch[0], prompt, completions, version=sampled, team=ex.team,
                                         producer_id=x.id)
            else:
                episodes = await self.sched.play(batch[0], self.n, seed)
                group = self.builder(x.engine.tokenizer, batch[0], episodes, version=version, team=ex.team,
                                     producer_id=x.id, min_episodes=ex.min_episodes_per_group, stats=x.stats)
            if group is not None:
                self.order.finish(seq, (group, version), time.monotonic())
                published = True  # now or once older groups have gone out (`_release`): its slot closes on the ack
                self._release()
        finally:
            if not published:  # dropped, failed or cancelled: its admission slot is released
                self.order.cancel(seq)
                x.admission.close_group(version, False)

    def _release(self, everything: bool = False) -> None:
        """Publish the finished groups `publish_order` lets go now."""
        for group, version in self.order.due(time.monotonic(), everything=everything):
            self._publish(group, version)

    def _publish(self, group: RolloutGroup, version: int) -> None:
        x, trajectories = self.x, len(group.trajectories)

        def acked(err, msg) -> None:  # CheckedProducer reports successes only; failures are resent or raise
            self.unacked -= 1
            x.admission.close_group(version, True)
            x.stats["groups"] += 1
            x.stats["trajectories"] += trajectories

        t0 = time.monotonic()
        for t in group.trajectories:
            self.lengths[length_bucket(model_turns(t.mask()))] += 1
        self.unacked += 1
        x.producer.produce(x.topic, key=group.group_id.encode(), value=encode(group), on_delivery=acked)
        self.busy["publish_busy_s"] += time.monotonic() - t0

    def _stages(self) -> None:
        """The engine's stages into the explorer's stats (load_s and eval_s are counted there already)."""
        s = self.sched.stats
        self.x.stats.update(generate_s=s["generate_s"], env_s=s["env_s"], reserve_s=s["reserve_s"],
                            admission_wait_s=s["idle_s"],
                            **self.busy)

    def _progress(self, generated: int, dropped: int) -> None:
        slots = self.x.members.slots
        if time.monotonic() - self.run_state.last_metric <= 5 or not slots:
            return
        self._stages()
        published = max(1, sum(self.lengths.values()))
        self.x.progress(self.run_state, slots, generated, dropped, **self.busy,
                        episodes_in_flight=self.sched.episodes_in_flight, env_in_flight=self.sched.env_in_flight,
                        generate_calls=self.sched.stats["generate_calls"], groups_held=self.order.held(),
                        groups_overtaking=self.order.overtook, groups_waited_out=self.order.waited_out,
                        **{f"published_{k}": v / published for k, v in self.lengths.items()})
