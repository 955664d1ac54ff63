"""The evaluator role: the run's held-out eval, beside the explorers and never in their way.

Run with `streamrft evaluate CONFIG`; `streamrft run` starts one (`eval.runner: evaluator`, the
default). It follows the weights topic as an explorer does (`WeightsWatcher`: fetch, verify, delta
chains), loads each version it takes into a rollout engine of its own and plays the eval tasks
greedily (`evaluate.evaluate_run`) whenever the version it holds is at least `eval.every_versions`
past the last one it evaluated: a slow eval skips versions, it never falls behind. With
`eval.schedule: fixed` it evaluates every version divisible by `eval.every_versions` instead, in
order (the watcher queues them), and on a stop goes on with the queue for `eval.drain_s`. Each result is an
`eval_reward` metric of role `eval`. The role runs at niceness `eval.nice`: on shared cores the
loop's roles get the cycles first. `eval.runner: explorer` evaluates inline in the explorer that
holds slot 0 instead (no engine of its own: a GPU with no room for one), pausing its generation.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path

from streamrft.config import RunConfig
from streamrft.infra.kafka import flush_or_raise, make_producer
from streamrft.infra.objectstore import WeightStore
from streamrft.monitor.prometheus import role_metrics
from streamrft.producers.tasks import run_task_file
from streamrft.producers.workflows.prompts import attach_vision
from streamrft.producers.weights_watcher import WeightsWatcher
from streamrft.schemas import Metric, encode, topic_name

log = logging.getLogger(__name__)


def due(version: int, last: int, every: int) -> bool:
    """Evaluate `version` now? Once it is `every` versions past the `last` evaluated (the newest
    version a slow evaluator holds, so it skips versions instead of queueing them)."""
    return every > 0 and version >= last + every


class Evaluator:
    def __init__(self, cfg: RunConfig, stop: threading.Event | None = None):
        import torch

        from streamrft.engine.rollout import engine_from_config

        if not cfg.data.eval:
            raise ValueError("the evaluator needs data.eval (a file of held-out tasks)")
        torch.set_num_threads(cfg.explorer.torch_threads)
        self.cfg = cfg
        self.id = f"evaluator-{os.getpid()}"
        self.stop = stop or threading.Event()
        self.engine = engine_from_config(cfg)
        attach_vision(self.engine, cfg)
        self.tasks = run_task_file(cfg, cfg.data.eval, cfg.eval.max_tasks)
        self.producer = make_producer(cfg.kafka)
        self.fixed = cfg.eval.schedule == "fixed"
        self.watcher = WeightsWatcher(cfg.kafka, cfg.namespace, WeightStore(cfg.s3), cfg.model.name, cfg.weights_key,
                                      Path(cfg.output_dir) / "cache" / self.id,
                                      every=cfg.eval.every_versions if self.fixed else None)
        self.stats = {"evals": 0, "load_s": 0.0, "eval_s": 0.0}
        self.scores: dict[int, float] = {}
        self.prom = role_metrics(cfg.monitor.prometheus, "evaluator")

    def evaluate(self) -> float:
        from streamrft.producers.evaluate import evaluate_run

        v, t0 = self.engine.version, time.monotonic()
        score = evaluate_run(self.engine, self.tasks, self.cfg)
        self.stats["eval_s"] += time.monotonic() - t0
        self.stats["evals"] += 1
        self.scores[v] = score
        m = Metric.of_finite("eval", self.id, v, {"eval_reward": score, "version": v, **self.stats,
                                                  "fetch_s": self.watcher.fetch_s, "queued": self.watcher.queued,
                                                  "skipped": self.watcher.skipped})
        self.prom.observe(m)
        self.producer.produce(topic_name(self.cfg.namespace, "metrics"), key=self.id.encode(), value=encode(m))
        flush_or_raise(self.producer)
        log.info("eval v%d: %.3f", v, score)
        return score

    def run(self) -> dict:
        last = self.engine.version  # the prepared model: `streamrft run` evaluates it before the roles start
        self.watcher.start()
        try:
            while not self.stop.is_set():
                loaded = self.watcher.swap_into(self.engine)
                self.stats["load_s"] += loaded or 0.0
                if (loaded is not None) if self.fixed else due(self.engine.version, last, self.cfg.eval.every_versions):
                    last = self.engine.version
                    self.evaluate()
                else:
                    self.stop.wait(0.2)
            deadline = time.monotonic() + self.cfg.eval.drain_s
            while self.fixed and self.watcher.has_ready and time.monotonic() < deadline:  # the queue, in order
                self.stats["load_s"] += self.watcher.swap_into(self.engine) or 0.0
                self.evaluate()
        finally:
            self.watcher.stop()
            try:
                flush_or_raise(self.producer)
            finally:
                self.producer.close()
                self.prom.close()
        return {**self.stats, "scores": self.scores}


def run_evaluator(cfg: RunConfig) -> int:
    os.nice(cfg.eval.nice)  # before the engine's imports and load: the loop's roles start first
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stats = Evaluator(cfg, stop).run()
    print(f"evaluator done: {stats}", flush=True)
    return 0
