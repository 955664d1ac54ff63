"""The evaluator role on the real stack: it follows the weights topic, evaluates the version it holds
once it is `eval.every_versions` past the last one evaluated (skipping versions rather than queueing
them), or with `eval.schedule: fixed` every k-th version in order; its score is the eval of exactly
those weights."""
from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

torch = pytest.importorskip("torch")

from streamrft.config import dump_config, load_config  # noqa: E402
from streamrft.engine.models import load_policy  # noqa: E402
from streamrft.engine.rollout import engine_from_config  # noqa: E402
from streamrft.engine.weights import publish_state_dict  # noqa: E402
from streamrft.infra.kafka import ensure_topics, flush_or_raise, make_producer, run_topics  # noqa: E402
from streamrft.infra.objectstore import WeightStore  # noqa: E402
from streamrft.launch.prepare import prepare  # noqa: E402
from streamrft.launch.run import runs_evaluator  # noqa: E402
from streamrft.producers.evaluate import evaluate_run  # noqa: E402
from streamrft.producers.evaluator import Evaluator, due  # noqa: E402
from streamrft.producers.tasks import load_task_file  # noqa: E402
from streamrft.schemas import WeightVersion, encode, topic_name  # noqa: E402
from tests_helpers import stack_overrides, wait_for  # noqa: E402


def test_due_skips_versions_instead_of_queueing_them():
    assert not due(0, 0, 3) and not due(2, 0, 3)
    assert due(3, 0, 3) and due(7, 0, 3)  # a slow evaluator holding v7 evaluates it, not v3 then v6
    assert not due(8, 7, 3) and due(10, 7, 3)
    assert not due(50, 0, 0)  # every_versions 0: only the run's start and end evals


def test_runs_evaluator_follows_the_config(tmp_path, stack):
    base = [*stack_overrides(stack, tmp_path), "data.eval=e.jsonl"]
    assert runs_evaluator(load_config("examples/cpu_demo.yaml", base))
    assert not runs_evaluator(load_config("examples/cpu_demo.yaml", [*base, "eval.runner=explorer"]))
    assert not runs_evaluator(load_config("examples/cpu_demo.yaml", [*base, "eval.every_versions=0"]))
    assert not runs_evaluator(load_config("examples/cpu_demo.yaml", [*stack_overrides(stack, tmp_path), "data.eval=null"]))


def _kit(tmp_path, stack, namespace, *overrides):
    """A prepared CPU demo config and `announce(v)`: version v's weights (noise on every tensor, so
    each has its own greedy eval) published to S3 and announced; also the states and the store."""
    cfg = load_config("examples/cpu_demo.yaml", [
        *stack_overrides(stack, tmp_path), f"namespace={namespace}", "stages=[]", "eval.every_versions=3",
        "eval.max_tasks=10", "data.synthetic={task: reverse, train_size: 20, eval_size: 10, seed: 0}", *overrides])
    cfg = prepare(cfg)
    ensure_topics(cfg.kafka, run_topics(cfg.kafka, cfg.namespace))
    model, _ = load_policy(cfg.model.path)
    base = {k: t.detach().clone() for k, t in model.state_dict().items()}
    gen = torch.Generator().manual_seed(1)
    states = {v: {k: t + 0.5 * v * torch.randn(t.shape, generator=gen) for k, t in base.items()} for v in range(1, 8)}
    if model.config.tie_word_embeddings:  # one tensor under two names: keep them one
        for state in states.values():
            state["lm_head.weight"] = state["model.embed_tokens.weight"]
    store = WeightStore(cfg.s3)
    store.ensure_bucket()
    producer = make_producer(cfg.kafka)

    def announce(v: int) -> None:
        manifest = publish_state_dict(store, cfg.weights_key, v, states[v], meta={"step": v})
        wv = WeightVersion(model=cfg.model.name, version=v, bucket=store.bucket,
                           prefix=store.prefix(cfg.weights_key, v), manifest_sha256=manifest.sha256, step=v)
        producer.produce(topic_name(cfg.namespace, "weights"), key=cfg.model.name.encode(), value=encode(wv))
        flush_or_raise(producer)

    return cfg, states, store, announce


def _scores_are_of_those_weights(cfg, states, scores: dict[int, float]) -> None:
    """Each score is the eval of that very version's weights, played here in an engine of our own."""
    engine = engine_from_config(cfg)
    tasks = load_task_file(cfg.data.eval, cfg.data.prompt_key, cfg.data.answer_key)[: cfg.eval.max_tasks]
    for v, score in scores.items():
        engine.load_weights(states[v], v)
        assert score == pytest.approx(evaluate_run(engine, tasks, cfg), abs=1e-9)


def test_evaluator_scores_the_weights_it_holds(tmp_path, stack, namespace):
    cfg, states, _, announce = _kit(tmp_path, stack, namespace)
    stop = threading.Event()
    ev = Evaluator(cfg, stop)
    result = {}
    thread = threading.Thread(target=lambda: result.update(ev.run()), daemon=True)
    thread.start()
    try:
        for v in (1, 2):
            announce(v)
        wait_for(lambda: ev.engine.version == 2, 60, "v2 loaded")
        announce(3)
        wait_for(lambda: 3 in ev.scores, 60, "v3 evaluated")
        for v in (4, 5):
            announce(v)
        wait_for(lambda: ev.engine.version == 5, 60, "v5 loaded")
        announce(7)  # v6 never comes to this evaluator (a slow one skips it likewise): 7 >= 3 + 3
        wait_for(lambda: 7 in ev.scores, 60, "v7 evaluated")
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not thread.is_alive()
    assert sorted(ev.scores) == [3, 7]  # 1, 2, 4, 5: fewer than 3 versions past the last evaluated
    _scores_are_of_those_weights(cfg, states, ev.scores)
    assert result["evals"] == 2


def test_a_fixed_schedule_evaluates_every_kth_version_in_order_however_late(tmp_path, stack, namespace):
    """`eval.schedule: fixed`: versions 1-7 are all announced before the evaluator starts (as a slow
    one finds them); it evaluates 2, 4 and 6 in that order, where `when_free` takes the newest alone.
    v4 was garbage-collected from the store before it was fetched: skipped and counted."""
    cfg, states, store, announce = _kit(tmp_path, stack, namespace, "eval.schedule=fixed", "eval.every_versions=2")
    for v in range(1, 8):
        announce(v)
    store.delete_version(cfg.weights_key, 4)
    stop = threading.Event()
    ev = Evaluator(cfg, stop)
    order = []
    evaluate = ev.evaluate
    ev.evaluate = lambda: (order.append(ev.engine.version), evaluate())[1]
    thread = threading.Thread(target=ev.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: 6 in ev.scores, 120, "v6 evaluated")
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not thread.is_alive()
    assert order == [2, 6] and ev.watcher.skipped == 1
    _scores_are_of_those_weights(cfg, states, ev.scores)


def test_a_fixed_schedule_drains_its_queue_when_stopped(tmp_path, stack, namespace):
    cfg, _, _, announce = _kit(tmp_path, stack, namespace, "eval.schedule=fixed", "eval.every_versions=1")
    stop = threading.Event()
    ev = Evaluator(cfg, stop)
    ev.watcher.start()
    for v in (1, 2, 3):
        announce(v)
    wait_for(lambda: ev.watcher.queued == 3, 60, "three versions queued")
    ev.watcher.stop()
    ev.watcher.start = lambda: ev.watcher  # run() starts it; it has done its part
    stop.set()  # told to stop before it evaluated anything: the queue is evaluated first, in order
    ev.run()
    assert list(ev.scores) == [1, 2, 3]


def test_the_evaluator_role_runs_niced(tmp_path, stack, namespace):
    """`streamrft evaluate` lowers its own CPU priority by eval.nice before loading anything heavy."""
    cfg = load_config("examples/cpu_demo.yaml", [
        *stack_overrides(stack, tmp_path), f"namespace={namespace}", "stages=[]", "eval.nice=7",
        "data.synthetic={task: reverse, train_size: 20, eval_size: 10, seed: 0}"])
    cfg = prepare(cfg)
    path = tmp_path / "config.yaml"
    path.write_text(dump_config(cfg))
    base = os.getpriority(os.PRIO_PROCESS, 0)
    proc = subprocess.Popen([sys.executable, "-m", "streamrft.cli", "evaluate", str(path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: proc.poll() is not None or os.getpriority(os.PRIO_PROCESS, proc.pid) == min(base + 7, 19), 60,
                 "the evaluator at niceness +7")
        assert proc.poll() is None, f"the evaluator exited with {proc.returncode}"
    finally:
        proc.terminate()
        proc.wait(timeout=120)  # niced +7 on a loaded machine: it finishes loading before it stops
