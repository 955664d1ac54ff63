"""Cleaning ops and the code_tests reward in a real stream-ops worker on the embedded stack: a
duplicate and a too-long response are dropped from their group (reasons on the experience, counts
on the worker's metrics), the rest is scored by running its code in the sandbox (one response
tries the network), and a task that leaks its answer in the prompt is dead-lettered."""
from __future__ import annotations

import yaml

from streamrft.infra.kafka import ensure_topics, flush_or_raise, make_producer, run_topics
from streamrft.schemas import encode, topic_name
from tests.stream_ops.test_stream_ops_integration import Outputs, make_group, start_worker, stop_worker

RIGHT = "```python\ndef f():\n    return 4\n```"
DUP = "Two plus two:\n```python\ndef f():\n    # two and two make five, I am sure of it\n    return 5\n```"
NETWORK = "```python\nimport socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)\ndef f():\n    return 4\n```"
LONG = RIGHT + "\n" + "Because two and two make four. " * 4


def test_cleaning_ops_in_the_worker(stack, namespace, tmp_path):
    kafka = stack.kafka
    ensure_topics(kafka, run_topics(kafka, namespace))
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({
        "namespace": namespace, "output_dir": str(tmp_path / "out"), "model": {"path": "unused"},
        "stack": {"embedded": False}, "kafka": kafka.model_dump(),
        "stream_ops": {"rewards": [{"name": "code_tests", "params": {"wall_s": 20}}], "ops": [
            {"type": "length", "params": {"max_chars": 150}},
            {"type": "dedup", "params": {"min_words": 5}},
            {"type": "prompt_copy"},
        ]},
    }))
    rollouts = topic_name(namespace, "rollouts", "default")
    producer = make_producer(kafka)
    clean = make_group("clean", "default", [RIGHT, DUP, NETWORK, DUP + "  ", LONG])
    clean.task.answer = "assert f() == 4"
    producer.produce(rollouts, encode(clean), b"clean")
    leaked = make_group("leak", "default", ["4", "5"])
    leaked.task.prompt, leaked.task.answer = "The secret is 98765. What is the secret?", "98765"
    producer.produce(rollouts, encode(leaked), b"leak")
    flush_or_raise(producer)

    out = Outputs(kafka, namespace)
    log = tmp_path / "worker.log"
    worker = start_worker(config, "w-ops", log)
    try:
        out.wait_for(lambda: out.experiences and out.dead and any(  # acked outputs, counted ops
            m.values["scored"] == 1 and m.values["dead_lettered"] == 1 for m in out.metrics), 90,
            "outputs and metrics", worker, log)
    finally:
        stop_worker(worker, log)
    out.close()
    (exp,) = out.experiences
    assert [t.traj_id for t in exp.trajectories] == ["clean-0", "clean-1", "clean-2"]
    assert exp.dropped == {"clean-4": f"length: {len(LONG)} chars > max_chars 150",
                           "clean-3": "dedup: exact duplicate of trajectory clean-1"}
    assert exp.rewards == [1.0, 0.0, 0.0]
    (dead,) = out.dead
    assert dead.key == b"leak" and dead.error_type == "RecordRejected"
    assert "op 'prompt_copy': the task's answer '98765' appears verbatim in its prompt" in dead.reason
    last = out.metrics[-1].values
    assert last["op.length.dropped"] == 1 and last["op.dedup.dropped"] == 1 and last["op.prompt_copy.dropped"] == 0
    assert last["op.prompt_copy.dead_lettered"] == 1 and last["op.groups_emptied"] == 0
