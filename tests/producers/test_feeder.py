import time

from streamrft.config import RunConfig
from streamrft.producers.feeder import feed_tasks
from streamrft.producers.synthetic import make_demo_tasks, write_jsonl
from streamrft.producers.tasks import TopicTasks


def test_fed_tasks_reach_explorers_through_the_tasks_topic(stack, namespace, tmp_path):
    path = tmp_path / "tasks.jsonl"
    rows = make_demo_tasks(12, seed=3)
    write_jsonl(rows, path)
    cfg = RunConfig.model_validate({"namespace": namespace, "model": {"path": str(tmp_path)}, "kafka": stack.kafka.model_dump(),
                                    "data": {"train": str(path), "source": "topic"}})
    assert feed_tasks(cfg, epochs=2) == 24
    source, got = TopicTasks(stack.kafka, namespace), []
    deadline = time.monotonic() + 60
    while len(got) < 24 and time.monotonic() < deadline:
        got += source.take(24 - len(got))
    source.close()
    assert sorted(t.task_id for t in got) == sorted(f"{r['task_id']}@{e}" for r in rows for e in range(2))
    assert {t.answer for t in got} == {r["answer"] for r in rows}
