"""The evaluator role on the real stack: it follows the weights topic, evaluates the version it holds
once it is `eval.every_versions` past the last one evaluated (skipping versions rather than queueing
them), and its score is the eval of exactly those weights."""
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


def test_evaluator_scores_the_weights_it_holds(tmp_path, stack, namespace):
    cfg = load_config("examples/cpu_demo.yaml", [
        *stack_overrides(stack, tmp_path), f"namespace={namespace}", "stages=[]", "eval.every_versions=3",
        "eval.max_tasks=10", "data.synthetic={task: reverse, train_size: 20, eval_size: 10, seed: 0}"])
    cfg = prepare(cfg)
    ensure_topics(cfg.kafka, run_topics(cfg.kafka, cfg.namespace))
    model, _ = load_policy(cfg.model.path)
    base = {k: t.detach().clone() for k, t in model.state_dict().items()}
    gen = torch.Generator().manual_seed(1)
    # each version's weights differ (noise on every tensor), so each has its own greedy eval
    states = {v: {k: t + 0.5 * v * torch.randn(t.shape, generator=gen) for k, t in base.items()} for v in (1, 2, 3, 4, 5, 7)}
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
    # the scores are the eval of those very weights, played here in an engine of our own
    engine = engine_from_config(cfg)
    tasks = load_task_file(cfg.data.eval, cfg.data.prompt_key, cfg.data.answer_key)[: cfg.eval.max_tasks]
    for v in (3, 7):
        engine.load_weights(states[v], v)
        assert ev.scores[v] == pytest.approx(evaluate_run(engine, tasks, cfg), abs=1e-9)
    assert result["evals"] == 2


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
        proc.wait(timeout=30)
