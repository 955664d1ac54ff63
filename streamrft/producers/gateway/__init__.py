"""The rollout gateway: other teams' agents train a run by calling an OpenAI-compatible endpoint.

`streamrft serve CONFIG` (or `streamrft run` with `gateway.enabled: true`) serves the policy at
its newest weight version through the explorers' rollout engine, hot-swapped as explorers swap
it, and turns the episodes agents run through it into RolloutGroups on `<ns>.rollouts.<team>`:
exact prompt and sampled token ids, behaviour log-probs and versions, never re-tokenized text.
- `prompts.py`: a request's prompt ids, reusing the episode's previous ids (no token drift);
- `worker.py`: the engine thread, batching concurrent requests;
- `episodes.py`: an episode's calls assembled (concatenated or step-wise);
- `groups.py`: open episodes and groups, admission, expiry, the acknowledged publish;
- `teams.py`: the API keys that decide a team;
- `feedback.py`: `POST /v1/feedback`, ratings that arrive later;
- `server.py`: the FastAPI app;
this module wires them to Kafka, S3 and the metrics topic. docs/gateway.md is the user's guide.
"""
from __future__ import annotations

import logging
import os
import threading
import uuid
from pathlib import Path

from streamrft.config import RunConfig

log = logging.getLogger(__name__)

METRICS_EVERY_S = 5.0


def build_gateway(cfg: RunConfig, environ: dict | None = None):
    """(the FastAPI app, the `Gateway`) for `cfg`, wired to its Kafka topics, S3 weights and engine."""
    import torch

    from streamrft.engine.rollout import engine_from_config
    from streamrft.infra.kafka import ensure_topics, flush_or_raise, make_producer, run_topics
    from streamrft.infra.objectstore import WeightStore
    from streamrft.monitor.prometheus import RoleMetrics
    from streamrft.producers.admission import groups_per_version, headroom
    from streamrft.producers.admission_log import AdmissionLog
    from streamrft.producers.fold_snapshot import FoldSnapshots
    from streamrft.producers.gateway.groups import GroupStore
    from streamrft.producers.gateway.server import Gateway, create_app
    from streamrft.producers.gateway.teams import TeamKeys
    from streamrft.producers.gateway.worker import EngineWorker
    from streamrft.producers.weights_watcher import WeightsWatcher
    from streamrft.producers.workflows.prompts import attach_vision
    from streamrft.schemas import Metric, encode, topic_name

    gcfg, ex = cfg.gateway, cfg.explorer
    keys = TeamKeys(gcfg.teams, environ)  # first: a missing key fails before anything starts
    if not gcfg.teams:
        raise ValueError("gateway.teams is empty: name at least one team and its key")
    torch.set_num_threads(ex.torch_threads)
    gateway_id = f"gateway-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    ensure_topics(cfg.kafka, run_topics(cfg.kafka, cfg.namespace, cfg.teams))
    engine = engine_from_config(cfg)
    attach_vision(engine, cfg)
    store = WeightStore(cfg.s3)
    watcher = WeightsWatcher(cfg.kafka, cfg.namespace, store, cfg.model.name, cfg.weights_key,
                             Path(cfg.output_dir) / "cache" / gateway_id)
    admission = AdmissionLog(cfg.kafka, cfg.namespace, gateway_id, snapshots=FoldSnapshots(cfg.s3, cfg.namespace))
    producer = make_producer(cfg.kafka)
    per_version = groups_per_version(cfg.trainer.batch_groups, cfg.trainer.sync_interval)
    S = cfg.trainer.max_staleness

    def room(generated: int, dropped: int, oldest: int | None) -> int:
        own = admission.in_flight_version if admission.in_flight else None
        older = min((v for v in (oldest, own) if v is not None), default=None)
        return headroom(engine.version, watcher.latest_announced, S, per_version, generated, dropped, older)

    def can_start() -> tuple[bool, str]:
        if not admission.caught_up.is_set():
            return False, "the gateway is still reading the run's admission counts"
        behind = watcher.latest_announced - engine.version
        if behind > S:
            return False, (f"the served weights v{engine.version} are {behind} versions behind v{watcher.latest_announced} "
                           f"(trainer.max_staleness={S}): loading the new ones")
        return True, ""

    publishing = threading.Lock()  # CheckedProducer is not thread-safe; publishes come from worker threads

    def publish(group) -> None:
        topic = topic_name(cfg.namespace, "rollouts", group.team)
        with publishing:
            producer.produce(topic, key=group.group_id.encode(), value=encode(group))
            flush_or_raise(producer)

    metrics_lock = threading.Lock()
    prom = RoleMetrics()  # GET /metrics on the gateway's own app, with monitor.prometheus.enabled

    def metric(m) -> None:
        prom.observe(m)
        with metrics_lock:
            metrics_producer.produce(topic_name(cfg.namespace, "metrics"), key=gateway_id.encode(), value=encode(m))

    evaluated: set[int] = set()
    eval_tasks: list = []

    def between() -> None:  # on the engine thread, between engine calls
        if not gcfg.evaluate or not cfg.data.eval or cfg.eval.every_versions <= 0:
            return
        v = engine.version
        if v in evaluated or v % cfg.eval.every_versions:
            return
        from streamrft.producers.evaluate import evaluate_run
        from streamrft.producers.tasks import run_task_file

        evaluated.add(v)
        if not eval_tasks:
            eval_tasks.extend(run_task_file(cfg, cfg.data.eval, cfg.eval.max_tasks))
        score = evaluate_run(engine, eval_tasks, cfg)
        metric(Metric.of_finite("eval", gateway_id, v, {"eval_reward": score, "version": v}))
        log.info("eval v%d: %.3f", v, score)

    metrics_producer = make_producer(cfg.kafka)
    gw_ref: list = []  # the Gateway, made below, counts the requests on their way to the worker
    worker = EngineWorker(engine, watcher.take, gcfg.batch_wait_ms / 1000, ex.engine.max_batch, between,
                          arriving=lambda: gw_ref[0].arriving if gw_ref else 0)
    groups = GroupStore(tokenizer=engine.tokenizer, producer_id=gateway_id,
                        default_size=gcfg.group_size or ex.group_size, group_timeout_s=gcfg.group_timeout_s,
                        episode_timeout_s=gcfg.episode_timeout_s, max_open_episodes=gcfg.max_open_episodes,
                        open_group=lambda v: admission.open_group(v, room),
                        close_group=admission.close_group, publish=publish)
    vision = getattr(engine, "vision", None)  # a vision-language model's: its media store takes image_url parts
    gw = Gateway(worker, groups, keys, model_name=cfg.model.name,
                 max_tokens=gcfg.max_tokens or ex.sampling.max_new_tokens,
                 max_context=gcfg.max_context or ex.max_total_tokens, can_start=can_start,
                 media=None if vision is None else vision.media)
    gw_ref.append(gw)

    def send_feedback(team: str, items: list) -> None:  # a worker thread's: acknowledged before the answer
        topic = topic_name(cfg.namespace, "feedback", team)
        with publishing:
            for f in items:
                producer.produce(topic, key=f.rated()[0].encode(), value=encode(f))
            flush_or_raise(producer)

    gw.send_feedback = send_feedback
    if gcfg.mode == "serve":  # users' completions, published to wait for their ratings
        gw.publish_served = publish
    follower = None
    if cfg.stream_ops.feedback() is not None:  # the labelling page's queue: the parked groups' answers
        from streamrft.producers.gateway.labels import LabelQueue, ParkedFollower
        from streamrft.stream_ops.feedback.joiner import policy_of

        policy = policy_of(cfg)
        gw.labels = LabelQueue(gcfg.label_overlap, gcfg.label_lease_s, policy.allows)
        follower = ParkedFollower(cfg, gw.labels)

    def publish_metrics() -> None:  # on the event loop (the counters' thread), every METRICS_EVERY_S
        opened = groups.open_counts()
        for team in keys.names:
            values = {k: float(v) for k, v in groups.counters[team].items()}
            values.update({k: float(v) for k, v in opened.get(team, {"open_groups": 0, "open_episodes": 0}).items()})
            metric(Metric.of_finite("gateway", f"{gateway_id}:{team}", engine.version, values))
        metric(Metric.of_finite("gateway", gateway_id, engine.version,
                                {"unauthorized": float(gw.unauthorized), "version": float(engine.version),
                                 **{k: float(v) for k, v in worker.stats.items()}}))

    gw.report, gw.report_every_s = publish_metrics, METRICS_EVERY_S

    def on_start() -> None:
        watcher.start()
        admission.start()
        worker.start()
        if follower is not None:
            follower.start()
        if not admission.caught_up.wait(60):
            log.warning("admission counts not read within 60 s: new episodes get 429 until they are")
        log.info("gateway %s serves %s v%d for teams %s", gateway_id, cfg.model.name, engine.version, keys.names)

    def on_stop() -> None:
        worker.stop()
        if follower is not None:
            follower.stop()
        groups.close()
        watcher.stop()
        admission.stop()
        publish_metrics()
        try:
            with metrics_lock:
                flush_or_raise(metrics_producer)
            with publishing:
                flush_or_raise(producer)
        finally:
            metrics_producer.close()
            producer.close()
        log.info("gateway stopped: %s", {t: dict(c) for t, c in groups.counters.items()})

    app = create_app(gw, on_start, on_stop)
    if cfg.monitor.prometheus.enabled:
        prom.route(app)
        log.info("prometheus: gateway metrics on http://%s:%d/metrics", gcfg.host, gcfg.port)
    return app, gw


def serve(cfg: RunConfig) -> int:
    import uvicorn

    app, _ = build_gateway(cfg)
    print(f"gateway: http://{cfg.gateway.host}:{cfg.gateway.port}/v1 (teams {[t.name for t in cfg.gateway.teams]})",
          flush=True)
    uvicorn.run(app, host=cfg.gateway.host, port=cfg.gateway.port, log_level="warning", timeout_graceful_shutdown=10)
    return 0


__all__ = ["build_gateway", "serve"]
