"""`streamrft run CONFIG [key=value ...]`: one whole run on this machine.

Starts the embedded stack unless the config names external ones, prepares data/model/warm-up,
creates the run's topics, launches the trainer, one stream-ops worker, `explorer.num_explorers`
explorers and, with `gateway.enabled`, the gateway as processes (`streamrft
train|score|explore|serve` on the resolved config), restarts a role that fails (as compose's
`restart: on-failure` does), shows a live progress line, and stops everything at the end or on
Ctrl-C. It prints one `final:` line and writes `reward_curve.png`, the resolved config and, through
one `MetricLogger`, every role's metrics from the metrics topic to `monitor.backends` (the roles
themselves are started with `monitor.backends=[]`, so nothing is logged twice). With
`monitor.dashboard.enabled` it serves the run's live page (`streamrft.monitor.dashboard`) and prints its URL.
"""
from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

from streamrft.config import RunConfig, dump_config, load_config
from streamrft.launch.prepare import PREPARED
from streamrft.launch.quiet import quiet_libraries
from streamrft.launch.restarts import RestartBudget
from streamrft.launch.roles import spawn, start_server


def _write_roles(path: Path, procs: dict[str, subprocess.Popen]) -> None:
    """Who runs where, for people and for `kill` (rewritten when a role is restarted)."""
    path.write_text(json.dumps({name: p.pid for name, p in procs.items()}, indent=1))


def _stop(procs: dict[str, subprocess.Popen], timeout: float = 20.0) -> None:
    for p in procs.values():
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for p in procs.values():
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def runs_evaluator(cfg: RunConfig) -> bool:
    """Does the run evaluate held-out during the run in an evaluator role (`producers/evaluator.py`)?"""
    return (cfg.eval.runner == "evaluator" and bool(cfg.data.eval) and cfg.eval.every_versions > 0
            and not (cfg.gateway.enabled and cfg.gateway.evaluate))


def final_eval(cfg: RunConfig, version: int | None) -> float:
    """Greedy eval reward of `version` (None = the prepared initial model), fetched from S3 and verified."""
    import tempfile

    from streamrft.config import LoraSpec
    from streamrft.engine.rollout import engine_from_config
    from streamrft.engine.weights import fetch_state_dict
    from streamrft.infra.objectstore import WeightStore
    from streamrft.producers.evaluate import evaluate_run
    from streamrft.producers.tasks import run_task_file
    from streamrft.producers.workflows.prompts import attach_vision

    engine = engine_from_config(cfg)
    try:
        attach_vision(engine, cfg)
        if version is not None:
            with tempfile.TemporaryDirectory() as tmp:
                state, meta = fetch_state_dict(WeightStore(cfg.s3), cfg.weights_key, version, Path(tmp))
                engine.load_weights(state, version, LoraSpec.from_manifest(meta))
        return evaluate_run(engine, run_task_file(cfg, cfg.data.eval, cfg.eval.max_tasks), cfg)
    finally:
        # vLLM: its GPU memory back before the roles start (the start eval runs alone on the GPU)
        close = getattr(engine, "close", None)
        if close is not None:
            close()


def plot_curve(path: Path, evals: list[tuple[float, int, float]], train: list[tuple[float, int, float]],
               eval_label: str = "greedy") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    if train:
        ax.plot([t for t, _, _ in train], [r for _, _, r in train], ".", alpha=0.4, label="train reward (batch mean)")
    if evals:
        ax.plot([t for t, _, _ in evals], [r for _, _, r in evals], "o-", label=f"held-out eval reward ({eval_label})")
    ax.set_xlabel("wall seconds")
    ax.set_ylabel("reward")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _start_dashboard(cfg: RunConfig):
    """The run's live page, served from this process; a busy configured port (another run's
    dashboard) gives way to a free one rather than failing the run."""
    from streamrft.monitor.dashboard import Dashboard

    try:
        dash = Dashboard(cfg)
    except OSError as e:
        print(f"dashboard: port {cfg.monitor.dashboard.port} not available ({e.strerror}): taking a free one",
              flush=True)
        dash = Dashboard(cfg, port=0)
    print(f"dashboard: {dash.start()} (docs/dashboard.md)", flush=True)
    return dash


def _publish_final(cfg: RunConfig, version: int, final: dict[str, float]):
    """The `final:` line's figures on the metrics topic (role `run`): the dashboard's "finished".
    Returns the Metric."""
    from streamrft.infra.kafka import flush_or_raise, make_producer
    from streamrft.schemas import Metric, encode, topic_name

    producer = make_producer(cfg.kafka)
    m = Metric.of_finite("run", "launcher", version, final)
    producer.produce(topic_name(cfg.namespace, "metrics"), key=b"launcher", value=encode(m))
    flush_or_raise(producer)
    return m


def _publish_eval(cfg: RunConfig, version: int, reward: float):
    """The launcher's own evals (start and end) on the metrics topic, beside the explorers' ones:
    the dashboard and any later reader see the whole curve. Returns the Metric."""
    from streamrft.infra.kafka import flush_or_raise, make_producer
    from streamrft.schemas import Metric, encode, topic_name

    producer = make_producer(cfg.kafka)
    m = Metric.of_finite("eval", "launcher", version, {"eval_reward": reward, "version": version})
    producer.produce(topic_name(cfg.namespace, "metrics"), key=b"launcher", value=encode(m))
    flush_or_raise(producer)
    return m


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def run(config_path: str, overrides: list[str]) -> int:
    from streamrft.infra.stack import embedded_stack, resolve_clients

    t_start = time.monotonic()
    quiet_libraries()  # before the fork server starts: it and every role inherit the environment
    # Ctrl-C and `kill PID` stop every role, then the stack it started. Both are set here: by default
    # SIGTERM would end the launcher alone and leave its roles and the stack running, and a launcher
    # started in the background by a script inherits SIGINT ignored
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    cfg = load_config(config_path, overrides)
    if cfg.fork_roles:
        start_server()  # its imports overlap the stack's start, the warm-up and the start eval
    run_name = f"{cfg.namespace}-{time.strftime('%Y%m%d-%H%M%S')}"
    cfg.namespace = run_name
    out = (Path(cfg.output_dir) / run_name).resolve()
    stages_cache = out.parent / PREPARED  # warm-up stages shared with `streamrft prepare` and other runs
    cfg.output_dir = str(out)
    out.mkdir(parents=True, exist_ok=True)

    es, started_stack = None, False
    if cfg.stack.embedded:
        es = embedded_stack(cfg.stack, cfg.s3)
        started_stack = not any(es.running().values())
        state = es.up()
        print(f"stack: kafka {state.kafka}, s3 http://{state.s3} ({'started' if started_stack else 'already running'})", flush=True)
        cfg.kafka, cfg.s3 = resolve_clients(cfg.stack, cfg.kafka, cfg.s3)
        cfg.stack.embedded = False  # the roles use these addresses as they are
    try:
        return _run_roles(cfg, out, t_start, stages_cache)
    finally:
        if es is not None and started_stack:
            print(f"stack down: stopped {', '.join(es.down())}", flush=True)


def _run_roles(cfg: RunConfig, out: Path, t_start: float, stages_cache: Path | None = None) -> int:
    from streamrft.monitor.loggers import MetricLogger

    metric_logger = MetricLogger.for_run(cfg)  # the stages' losses, every role's metrics, the evals
    try:
        return _run_logged(cfg, out, t_start, metric_logger, stages_cache)
    finally:
        metric_logger.close()


def _run_logged(cfg: RunConfig, out: Path, t_start: float, metric_logger, stages_cache: Path | None = None) -> int:
    from streamrft.infra.kafka import ensure_topics, run_topics
    from streamrft.launch.prepare import prepare
    from streamrft.launch.progress import MetricsFollower

    run_name = cfg.namespace
    procs: dict[str, subprocess.Popen] = {}
    follower = dashboard = None
    try:
        cfg = prepare(cfg, metric_logger, stages_cache)
        resolved = out / "config.yaml"
        resolved.write_text(dump_config(cfg))
        ensure_topics(cfg.kafka, run_topics(cfg.kafka, cfg.namespace, cfg.teams))
        eval_start = final_eval(cfg, None)
        _publish_eval(cfg, 0, eval_start)  # logged, as every Metric, when the follower reads it
        if cfg.monitor.dashboard.enabled:  # after the start eval: the dashboard's tokenizer thread importing
            # transformers while this thread does raced transformers' lazy imports ("cannot import name")
            dashboard = _start_dashboard(cfg)
        print(f"run {run_name}: output {out}; eval reward at start {eval_start:.3f}", flush=True)
        if cfg.gateway.enabled:
            print(f"gateway: http://{cfg.gateway.host}:{cfg.gateway.port}/v1 for teams "
                  f"{', '.join(t.name for t in cfg.gateway.teams)} (docs/gateway.md)", flush=True)

        logs = out / "logs"
        role_cfg = [str(resolved), "monitor.backends=[]"]  # this process logs their metrics, off the topic
        commands = {"trainer": ["train", *role_cfg], "stream-ops": ["score", *role_cfg],
                    **{f"explorer-{i}": ["explore", *role_cfg, "--index", str(i)]
                       for i in range(cfg.explorer.num_explorers)},
                    **({"gateway": ["serve", *role_cfg]} if cfg.gateway.enabled else {}),
                    **({"feedback-join": ["join", *role_cfg]} if cfg.stream_ops.feedback() else {}),
                    **({"evaluator": ["evaluate", *role_cfg]} if runs_evaluator(cfg) else {})}
        for name, args in commands.items():
            procs[name] = spawn(args, logs / f"{name}.log", cfg.fork_roles)
        budgets = {name: RestartBudget(cfg.restarts) for name in commands}
        due: dict[str, float] = {}  # failed roles waiting out their backoff: when each starts again
        # who runs where, for people and for `kill`: the launcher stops them all on exit or Ctrl-C
        _write_roles(out / "roles.json", procs)
        follower = MetricsFollower(cfg.kafka, cfg.namespace, metric_logger)
        follower.start_lag_thread()
        last_line, lines, last_profile = 0.0, 0, None
        # the loop's own time: preparation, warm-up stages and the start eval are not counted
        deadline = time.monotonic() + cfg.max_wall_s if cfg.max_wall_s else None
        while procs["trainer"].poll() is None or procs["trainer"].returncode != 0:
            view = follower.poll(0.5)
            for name, p in procs.items():
                if p.poll() is None or p.returncode == 0:
                    continue
                # a role that failed (e.g. a delivery it could not complete while the broker was
                # away) is started again and redoes its work from its durable state
                now = time.monotonic()
                if name not in due:
                    delay = budgets[name].delay(now)
                    if delay is None:
                        r = cfg.restarts
                        raise RuntimeError(f"{name} exited with {p.returncode} after {r.max_restarts} restarts "
                                           f"within {r.window_s:g} s; see {logs / (name + '.log')}")
                    due[name] = now + delay
                    print(f"{name} exited with {p.returncode}: restart {budgets[name].recent(now) + 1} of "
                          f"{cfg.restarts.max_restarts} within {cfg.restarts.window_s:g} s"
                          + (f", in {delay:g} s" if delay else ""), flush=True)
                if now >= due[name]:
                    del due[name]
                    budgets[name].restarted(now)
                    procs[name] = spawn(commands[name], logs / f"{name}.log", cfg.fork_roles)
                    _write_roles(out / "roles.json", procs)
            if time.monotonic() - last_line > 5:
                last_line = time.monotonic()
                print(view.line(), flush=True)
                lines += 1
                if lines % 6 == 0:  # every 30 s: where the time goes
                    last_profile = view.profile()
                    print(last_profile, flush=True)
            if deadline and time.monotonic() > deadline:
                print(f"max_wall_s={cfg.max_wall_s} reached: stopping", flush=True)
                break
        _stop({"trainer": procs["trainer"]}, timeout=60)
        if procs["trainer"].returncode not in (0, -signal.SIGTERM):
            raise RuntimeError(f"trainer exited with {procs['trainer'].returncode}; see {logs / 'trainer.log'}")
        _stop(procs)
        view = follower.poll(1.0)
    except KeyboardInterrupt:
        print("interrupted: stopping every role", flush=True)
        _stop(procs)
        if dashboard is not None:
            dashboard.stop()
        return 130
    except BaseException:
        if dashboard is not None:
            dashboard.stop()
        raise
    finally:
        _stop(procs)
        if follower is not None:
            follower.close()
    try:
        return _finish(cfg, out, t_start, metric_logger, view, eval_start, last_profile, dashboard)
    finally:
        if dashboard is not None:
            dashboard.stop()


def _finish(cfg: RunConfig, out: Path, t_start: float, metric_logger, view, eval_start: float,
            last_profile: str | None, dashboard) -> int:
    """The end eval, the curve, the `final:` line, and the same on the metrics topic (role `run`),
    which the dashboard shows as the run's end before it stops."""
    from streamrft.infra.objectstore import WeightStore

    version = WeightStore(cfg.s3).latest_version(cfg.weights_key) or 0
    eval_end = final_eval(cfg, version)
    view.evals.append((time.time() - view.t0, version, eval_end))
    metric_logger.log(_publish_eval(cfg, version, eval_end))  # the follower has stopped reading
    ev = cfg.eval
    plot_curve(out / "reward_curve.png", view.evals, view.train_rewards,
               f"T={ev.temperature:g}, {ev.samples} per task" if ev.temperature > 0 else "greedy")
    trajectories = view.trajectories
    if view.profile() != last_profile:  # the run's last word on where the time went, once
        print(view.profile(), flush=True)
    print(f"reward curve: {out / 'reward_curve.png'}; logs: {out / 'logs'}; metrics: "
          f"{', '.join(cfg.monitor.backends) or 'no backend'} under {out}", flush=True)
    if cfg.monitor.dashboard.enabled:
        print(f"dashboard of this run, now finished: streamrft dashboard {out / 'config.yaml'}", flush=True)
    from streamrft.launch.progress import stale_pct

    trained, stale = int(view.trainer.get("count_trained", 0)), int(view.trainer.get("count_stale", 0))
    final = {"eval_reward_start": eval_start, "eval_reward_end": eval_end, "versions": version,
             "trajectories": trajectories, "trained": trained, "stale": stale,
             "stale_pct": stale_pct(trained, stale), "wall_s": time.monotonic() - t_start}
    metric_logger.log(_publish_final(cfg, version, final))
    if dashboard is not None and not dashboard.settle(10.0):
        print("dashboard: the run's end did not reach every open page within 10 s", flush=True)
    print(f"final: eval_reward_start={eval_start:.3f} eval_reward_end={eval_end:.3f} versions={version} "
          f"trajectories={trajectories} trained={trained} stale={stale} stale_pct={final['stale_pct']:.1f} "
          f"wall_s={final['wall_s']:.0f}", flush=True)
    return 0
