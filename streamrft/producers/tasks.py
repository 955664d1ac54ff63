"""Where explorers get tasks: a local dataset file (JSONL or Parquet, through HF `datasets`) or
the run's tasks topic. Several explorers reading one file each take a disjoint shard."""
from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

from streamrft.config import DataConfig, KafkaConfig
from streamrft.schemas import DecodeError, Task, decode, topic_name


def load_task_file(path: str | Path, prompt_key: str = "prompt", answer_key: str = "answer") -> list[Task]:
    """Read every row of a JSONL / Parquet file into Tasks (a stable task_id per row)."""
    from datasets import load_dataset

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"task file {path} does not exist")
    fmt = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}.get(path.suffix)
    if fmt is None:
        raise ValueError(f"task file {path}: suffix must be .jsonl, .json or .parquet")
    rows = load_dataset(fmt, data_files=str(path), split="train")
    if prompt_key not in rows.column_names:
        raise ValueError(f"task file {path} has no column {prompt_key!r}; columns: {rows.column_names}")
    tasks = []
    for i, row in enumerate(rows):
        answer = row.get(answer_key)
        meta = {k: v for k, v in row.items() if k not in (prompt_key, answer_key, "task_id")}
        tasks.append(Task(task_id=str(row.get("task_id") or f"{path.stem}-{i}"), prompt=row[prompt_key],
                          answer=None if answer is None else str(answer), metadata=meta))
    return tasks


def file_tasks(tasks: list[Task], shard: int, num_shards: int, shuffle: bool, seed: int) -> Iterator[Task]:
    """Cycle forever over this explorer's shard, reshuffled every epoch."""
    mine = tasks[shard::num_shards] or tasks
    rng = random.Random(seed * 1000 + shard)
    while True:
        order = list(mine)
        if shuffle:
            rng.shuffle(order)
        yield from order


def topic_tasks(kafka: KafkaConfig, namespace: str, on_bad=None) -> Iterator[Task]:
    """Tasks from the tasks topic through the `<ns>.explorers` group (offsets auto-committed:
    a task lost to a crash is only a prompt, not a trajectory)."""
    from streamrft.infra.kafka import make_consumer

    consumer = make_consumer(kafka, f"{namespace}.explorers", **{"enable.auto.commit": True})
    consumer.subscribe([topic_name(namespace, "tasks")])
    try:
        while True:
            msg = consumer.poll(1.0)
            if msg is None or msg.error() is not None:
                continue
            try:
                yield decode(msg.value(), Task)
            except DecodeError as e:
                if on_bad is not None:
                    on_bad(msg, e)
    finally:
        consumer.close()


def make_task_source(data: DataConfig, kafka: KafkaConfig, namespace: str, shard: int, num_shards: int,
                     on_bad=None) -> Iterator[Task]:
    if data.source == "topic":
        return topic_tasks(kafka, namespace, on_bad)
    if not data.train:
        raise ValueError("data.train must name a task file when data.source is 'file'")
    tasks = load_task_file(data.train, data.prompt_key, data.answer_key)
    return file_tasks(tasks, shard, num_shards, data.shuffle, data.seed)
