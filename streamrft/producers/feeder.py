"""`streamrft feed CONFIG`: publish a dataset file's rows as Tasks on the run's tasks topic.

With `data.source: topic`, explorers take tasks from that topic through one consumer group, so
any number of explorers share the work without a shard plan, and curricula or other teams can
feed tasks while the run goes on.
"""
from __future__ import annotations

from streamrft.config import RunConfig
from streamrft.infra.kafka import ensure_topics, flush_or_raise, make_producer, run_topics
from streamrft.producers.tasks import run_task_file
from streamrft.schemas import encode, topic_name


def feed_tasks(cfg: RunConfig, path: str | None = None, epochs: int = 1) -> int:
    """Publish every row of `path` (default `data.train`) `epochs` times; returns the count."""
    path = path or cfg.data.train
    if not path:
        raise ValueError("nothing to feed: give a file or set data.train")
    tasks = run_task_file(cfg, path)
    ensure_topics(cfg.kafka, run_topics(cfg.kafka, cfg.namespace, cfg.teams))
    producer = make_producer(cfg.kafka)
    topic = topic_name(cfg.namespace, "tasks")
    for epoch in range(epochs):
        for t in tasks:
            task = t.model_copy(update={"task_id": t.task_id if epochs == 1 else f"{t.task_id}@{epoch}"})
            producer.produce(topic, key=task.task_id.encode(), value=encode(task))
            producer.poll(0)
    flush_or_raise(producer)
    return len(tasks) * epochs
