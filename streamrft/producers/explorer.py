"""The explorer role: tasks in, RolloutGroups out, weights hot-swapped between generations.

Run one with `streamrft explore CONFIG --index I`, at any time, as many as you like;
`streamrft run` starts `explorer.num_explorers` of them. The index names the explorer (its id,
logs, shuffle seed). Explorers present share the run's slots (`membership.py`): each takes the
file tasks of its slots and that share of the admission headroom, and the shares move when one
joins or leaves. Each runs its workflow (`explorer.workflow`: single-turn samples, or multi-turn
episodes in `explorer.env`) on up to `tasks_per_batch` tasks x `group_size` samples at a time,
publishes every group whole (acks=all), and waits while admission control (`admission.py`) says
that what all explorers generated already would keep the trainer busy until a group started now
arrived too stale. Which of its tasks come next is `explorer.task_selector`'s choice
(`task_selection.py`; the difficulty selector reads the per-task pass rates all explorers share
from `<ns>.task-stats`, `task_stats.py`). The held-out eval runs in a role of its own
(`evaluator.py`); with `eval.runner: explorer` the holder of slot 0 evaluates each
`eval.every_versions`-th version between its generations, so the eval survives the departure of any
one explorer.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
import time
import uuid
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from streamrft.config import RunConfig
from streamrft.infra.kafka import flush_or_raise, make_producer
from streamrft.infra.media import MediaStore
from streamrft.infra.objectstore import WeightStore
from streamrft.monitor.prometheus import role_metrics
from streamrft.producers.admission import explorer_share, groups_per_version, headroom
from streamrft.producers.admission_log import AdmissionLog
from streamrft.producers.fold_snapshot import FoldSnapshots
from streamrft.producers.membership import Membership
from streamrft.producers.task_selection import TaskStats, make_selector, uses_stats
from streamrft.producers.task_stats import TaskStatsReader
from streamrft.producers.tasks import FileTasks, make_task_source, run_task_file
from streamrft.producers.weights_watcher import WeightsWatcher
from streamrft.producers.workflows import make_workflow
from streamrft.producers.workflows.prompts import attach_vision
from streamrft.schemas import Metric, encode, topic_name
from streamrft.stream_ops.rewards import check_tasks

log = logging.getLogger(__name__)

STAGES = ("generate_s", "env_s", "publish_s", "reserve_s", "admission_wait_s", "slot_wait_s", "task_wait_s", "load_s",
          "eval_s")
"""Where an explorer's loop spends its time (seconds, in its metrics): generating, waiting for
environments with nothing else to generate, publishing and waiting for the broker's acks, deciding
its admission share, waiting for admission room, for a slot or for tasks, loading new weights into
the engine, evaluating held-out. In lockstep the engine waits while the environments step;
scheduled one by one (`episode_loop.py`) the stages are the engine's: publishing and reserving run
beside it and are counted apart (`publish_busy_s`, `reserve_busy_s`)."""


class Explorer:
    def __init__(self, cfg: RunConfig, index: int, stop: threading.Event | None = None):
        import torch

        from streamrft.engine.rollout import SamplingParams, engine_from_config

        torch.set_num_threads(cfg.explorer.torch_threads)
        self.cfg, self.index = cfg, index
        self.id = f"explorer-{index}-{os.getpid()}"
        self.stop = stop or threading.Event()
        ex = cfg.explorer
        self.members = Membership(cfg.kafka, cfg.namespace, self.id, cfg.explorer.num_slots)
        # its ledger's key: unique per process start (pids repeat across machines and containers)
        # the admission and task-stats folds start from their newest snapshots (`fold_snapshot.py`)
        self.admission = AdmissionLog(cfg.kafka, cfg.namespace, f"{self.id}-{uuid.uuid4().hex[:8]}",
                                      snapshots=FoldSnapshots(cfg.s3, cfg.namespace))
        # joining the group waits for the broker's rebalance (3 s on the embedded one) and the
        # admission counts for a read-back: both start here, so they overlap the engine's load
        # (seconds of imports on shared cores) instead of following it. A mid-run joiner holds
        # its slots that much longer before it generates; a failed load leaves the group at once.
        self.members.start()
        try:
            self.admission.start()
            self.engine = engine_from_config(cfg)
            self.producer = make_producer(cfg.kafka)
            self.store = WeightStore(cfg.s3)
            self.watcher = WeightsWatcher(cfg.kafka, cfg.namespace, self.store, cfg.model.name, cfg.weights_key,
                                          Path(cfg.output_dir) / "cache" / self.id)
            attach_vision(self.engine, cfg)  # a vision-language model: tasks show images
        except BaseException:
            self.members.stop()
            self.admission.stop()
            raise
        self.params = SamplingParams(n=ex.group_size, max_new_tokens=ex.sampling.max_new_tokens,
                                     temperature=ex.sampling.temperature, top_p=ex.sampling.top_p, top_k=ex.sampling.top_k)
        self.topic = topic_name(cfg.namespace, "rollouts", ex.team)
        self.per_version = groups_per_version(cfg.trainer.batch_groups, cfg.trainer.sync_interval)
        self.eval_tasks = None  # loaded when this explorer first holds slot 0
        self.prom = role_metrics(cfg.monitor.prometheus, "explorer", index)
        self._draws: dict[str, int] = {}  # task id -> groups of it taken (`group_seeds`)
        self.stats = {"groups": 0, "trajectories": 0, "swaps": 0, "admission_waits": 0, "slot_waits": 0,
                      "env_errors": 0, "env_timeouts": 0, "groups_dropped_env": 0, **dict.fromkeys(STAGES, 0.0)}

    def _metric(self, values: dict[str, float], role: str = "explorer") -> None:
        m = Metric.of_finite(role, self.id, self.engine.version, values)
        self.prom.observe(m)
        self.producer.produce(topic_name(self.cfg.namespace, "metrics"), key=self.id.encode(), value=encode(m))

    def eval_due(self, evaluated: set[int], slots: frozenset[int]) -> bool:
        """This explorer evaluates the version it holds now (`eval.runner: explorer`, slot 0)."""
        cfg, v = self.cfg, self.engine.version
        return not (cfg.eval.runner != "explorer" or 0 not in slots or not cfg.data.eval or cfg.eval.every_versions <= 0
                    or v in evaluated or v % cfg.eval.every_versions)

    def _maybe_eval(self, evaluated: set[int], slots: frozenset[int]) -> None:
        """Evaluate the version held now if `eval_due`; its time counts as `eval_s`."""
        from streamrft.producers.evaluate import evaluate_run

        cfg, v = self.cfg, self.engine.version
        if not self.eval_due(evaluated, slots):
            return
        t0 = time.monotonic()
        evaluated.add(v)
        if self.eval_tasks is None:
            self.eval_tasks = run_task_file(cfg, cfg.data.eval, cfg.eval.max_tasks)
        score = evaluate_run(self.engine, self.eval_tasks, cfg)
        self._metric({"eval_reward": score, "version": v}, role="eval")
        log.info("eval v%d: %.3f", v, score)
        self.stats["eval_s"] += time.monotonic() - t0

    def _wait(self, seconds: float, stage: str) -> None:
        t0 = time.monotonic()
        self.stop.wait(seconds)
        self.stats[stage] += time.monotonic() - t0

    def _timings(self, t_start: float) -> dict[str, float]:
        """Where this explorer's time went since it started (seconds, cumulative): the stages of its
        loop, the watcher's background fetch, and `wall_s` to read them against."""
        return {**{k: self.stats[k] for k in STAGES}, "fetch_s": self.watcher.fetch_s,
                "wall_s": time.monotonic() - t_start}

    def run(self) -> dict:
        cfg, ex = self.cfg, self.cfg.explorer
        seed = cfg.data.seed * 1000 + self.index
        selector = make_selector(ex.task_selector, seed, cfg.data.shuffle)
        stats = TaskStats(getattr(selector, "window", 64))
        reader = (TaskStatsReader(cfg.kafka, cfg.namespace, stats, FoldSnapshots(cfg.s3, cfg.namespace))
                  if uses_stats(ex.task_selector) else None)
        tasks = make_task_source(cfg.data, cfg.kafka, cfg.namespace, seed=seed, selector=selector, stats=stats,
                                 media=MediaStore.for_run(cfg))
        if isinstance(tasks, FileTasks):  # a task its rewards cannot score is refused now, not dead-lettered later
            check_tasks(cfg.stream_ops.rewards, tasks.tasks)
        run = _Run(tasks, reader, stats, selector)
        if reader is not None:
            reader.start()
        self.watcher.start()  # the membership and the admission log started before the engine's load
        try:
            if ex.scheduling == "per_episode":
                from streamrft.producers.episode_loop import EpisodeLoop

                EpisodeLoop(self, run).run()
            else:
                self._lockstep(run)
        finally:
            self.members.stop()  # leave the group first: the others take our slots at once
            self.watcher.stop()
            self.admission.stop()
            if reader is not None:
                reader.stop()
            tasks.close()
            self._metric({"groups": self.stats["groups"], "trajectories": self.stats["trajectories"],
                          "traj_per_s": 0.0, "version": self.engine.version, "swaps": self.stats["swaps"],
                          **self._timings(run.t_start)})  # the last profile keeps the explorers' stages
            try:
                flush_or_raise(self.producer)
            finally:
                self.producer.close()
                self.prom.close()
        return self.stats

    def swap(self) -> float | None:
        """Load the newest verified weights, if new ones came; the seconds it took, or None."""
        load_s = self.watcher.swap_into(self.engine)
        if load_s is not None:
            self.stats["load_s"] += load_s
            self.stats["swaps"] += 1
        return load_s

    def ready_slots(self) -> frozenset[int] | None:
        """This explorer's slots, or None (counted as a slot wait) while it has none or has not read
        the admission counts yet."""
        slots = self.members.slots
        if not slots or not self.admission.caught_up.is_set():
            self.stats["slot_waits"] += 1
            return None
        return slots

    def group_seeds(self, tasks: list) -> list[int] | None:
        """Each group's sampling seed (`explorer.sampling.seed`): (seed, task id, how many times this
        explorer took that task before), the same in lockstep and one by one; None when unseeded."""
        seed = self.cfg.explorer.sampling.seed
        if seed is None:
            return None
        from streamrft.engine.rollout.base import derive_seed

        seeds = []
        for task in tasks:
            draws = self._draws.get(task.task_id, 0)
            self._draws[task.task_id] = draws + 1
            seeds.append(derive_seed(seed, task.task_id, draws))
        return seeds

    def room(self):
        """`headroom(generated, dropped, oldest_in_flight)` with this engine's weights now."""
        cfg = self.cfg
        return partial(headroom, self.engine.version, self.watcher.latest_announced, cfg.trainer.max_staleness,
                       self.per_version)

    def progress(self, run: "_Run", slots: frozenset[int], generated: int, dropped: int, **extra) -> None:
        """Every 5 s, the explorer's counts and stages as a Metric."""
        if time.monotonic() - run.last_metric <= 5:
            return
        run.last_metric = time.monotonic()
        self._metric({"groups": self.stats["groups"], "trajectories": self.stats["trajectories"],
                      "traj_per_s": self.stats["trajectories"] / (run.last_metric - run.t_start),
                      "version": self.engine.version, "swaps": self.stats["swaps"],
                      "slots": len(slots), "admission_waits": self.stats["admission_waits"],
                      "run_generated": generated, "run_dropped": dropped, **self._timings(run.t_start),
                      "task_stats_groups": run.stats.groups, "tasks_skipped": getattr(run.selector, "skipped", 0),
                      **{k: self.stats[k] for k in ("env_errors", "env_timeouts", "groups_dropped_env")}, **extra})

    def _lockstep(self, run: "_Run") -> None:
        ex = self.cfg.explorer
        workflow = make_workflow(ex, stats=self.stats)
        while not self.stop.is_set():
            self.swap()
            slots = self.ready_slots()
            if slots is None:  # not joined yet, more explorers than slots, or the admission counts not read yet
                self._wait(0.2, "slot_wait_s")
                continue
            self._maybe_eval(run.evaluated, slots)
            room = self.room()
            generated, dropped, oldest = self.admission.counts()
            n = min(ex.tasks_per_batch, explorer_share(room(generated, dropped, oldest), slots,
                                                       self.members.num_slots))
            # of this share, what the records before the reservation on the admission topic leave
            t0 = time.monotonic()
            n = self.admission.reserve(n, self.engine.version, room) if n > 0 else 0
            self.stats["reserve_s"] += time.monotonic() - t0
            if n <= 0:
                self.stats["admission_waits"] += 1
                self._wait(0.05, "admission_wait_s")
                continue
            run.check_reader()
            batch = run.tasks.take(n, slots, self.members.num_slots)
            if not batch:  # our slots hold no task (tiny file), or the tasks topic is dry
                self.admission.end(0)
                self._wait(0.2, "task_wait_s")
                continue
            t0, env0 = time.monotonic(), self.stats["env_s"]
            seeds = self.group_seeds(batch)
            params = self.params if seeds is None else dataclasses.replace(self.params, seeds=seeds)
            groups = workflow(self.engine, batch, params, version=self.engine.version, team=ex.team,
                              producer_id=self.id, chat=ex.chat_template)
            # the shipped multi-turn workflows count their environments' time apart (env_s)
            self.stats["generate_s"] += time.monotonic() - t0 - (self.stats["env_s"] - env0)
            t0 = time.monotonic()
            for g in groups:
                self.producer.produce(self.topic, key=g.group_id.encode(), value=encode(g))
            flush_or_raise(self.producer)
            self.admission.end(len(groups))
            self.stats["publish_s"] += time.monotonic() - t0
            self.stats["groups"] += len(groups)
            self.stats["trajectories"] += sum(len(g.trajectories) for g in groups)
            self.progress(run, slots, generated, dropped)
            if ex.max_groups is not None and self.stats["groups"] >= ex.max_groups:
                break


@dataclass
class _Run:
    """What one `Explorer.run` reads from and keeps between iterations of its loop."""

    tasks: Any
    reader: TaskStatsReader | None
    stats: TaskStats
    selector: Any
    evaluated: set[int] = field(default_factory=set)
    t_start: float = field(default_factory=time.monotonic)
    last_metric: float = field(default_factory=time.monotonic)

    def check_reader(self) -> None:
        if self.reader is not None and self.reader.failed is not None:
            raise RuntimeError("the task-stats reader stopped") from self.reader.failed


def run_explorer(cfg: RunConfig, index: int) -> int:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stats = Explorer(cfg, index, stop).run()
    print(f"explorer {index} done: {stats}", flush=True)
    return 0
