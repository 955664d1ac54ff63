"""Where explorers get tasks: a local dataset file (JSONL or Parquet, through HF `datasets`) or
the run's tasks topic. Explorers reading one file take the tasks of the slots they hold now
(`membership.py`), so their shards stay disjoint while explorers come and go; on the topic, its
consumer group shares the tasks out. Both sources answer `take(n, slots, num_slots)`; which of a
file's tasks come next is the selector's choice (`task_selection.py`, `explorer.task_selector`)."""
from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from streamrft.config import DataConfig, KafkaConfig
from streamrft.producers.task_selection import Sequential, TaskStats
from streamrft.schemas import DecodeError, Task, decode, topic_name


IMAGE_KEYS = ("image", "images")  # a row's picture(s): a path (relative to the file), a file:// or s3:// URL, base64


def load_task_file(path: str | Path, prompt_key: str = "prompt", answer_key: str = "answer",
                   media=None, with_images: bool = True) -> list[Task]:
    """Read every row of a JSONL / Parquet file into Tasks (a stable task_id per row). A row's
    `image` (one) or `images` (a list) are stored in S3 by `media` (an `infra.media.MediaStore`)
    and become the task's `images` references; a file with images needs `media`, unless
    `with_images` is False (the tasks' text alone, their images left out)."""
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
        meta = {k: v for k, v in row.items() if k not in (prompt_key, answer_key, "task_id", *IMAGE_KEYS)}
        try:
            tasks.append(Task(task_id=str(row.get("task_id") or f"{path.stem}-{i}"), prompt=row[prompt_key],
                              answer=None if answer is None else str(answer), metadata=meta,
                              images=_row_images(row, path, i, media) if with_images else []))
        except ValidationError as e:  # e.g. NaN or a date in an extra column: not a JSON value
            err = e.errors()[0]
            where = ".".join(str(x) for x in err["loc"])
            raise ValueError(f"task file {path} row {i}: {where}: {err['msg']} (extra columns become "
                             f"metadata, which must be JSON values)") from None
    return tasks


def run_task_file(cfg, path: str | Path | None = None, limit: int | None = None) -> list[Task]:
    """The tasks of one of the run's files (`cfg`: a `RunConfig`; default `data.train`), the first
    `limit` of them, any images stored in the run's media store (`infra.media.MediaStore.for_run`)."""
    from streamrft.infra.media import MediaStore

    tasks = load_task_file(path or cfg.data.train, cfg.data.prompt_key, cfg.data.answer_key,
                           media=MediaStore.for_run(cfg))
    return tasks if limit is None else tasks[:limit]


def _row_images(row: dict, path: Path, i: int, media) -> list:
    sources = [row["image"]] if row.get("image") else list(row.get("images") or [])
    if not sources:
        return []
    if media is None:
        raise ValueError(f"task file {path} row {i}: it has images, and this reader has no store to put them in "
                         f"(a vision-language model's run)")
    from streamrft.infra.media import MediaError, resolve_source

    refs = []
    for k, source in enumerate(sources):
        try:
            refs.append(media.put(resolve_source(str(source), path.parent, media)))
        except MediaError as e:
            raise ValueError(f"task file {path} row {i}: image {k}: {e}") from None
    return refs


def task_slot(i: int, num_tasks: int, num_slots: int) -> int:
    """The slot of a file's i-th task: the file cut into `num_slots` runs of equal length (to one
    task). The membership's range assignor hands out contiguous slot ranges, so shards come out
    equal to about one task, and a file shorter than the slot count still spreads over all the
    slots instead of leaving the upper ones (and the explorers holding them) empty."""
    return i * num_slots // num_tasks


def slot_tasks(tasks: list[Task], slots: frozenset[int], num_slots: int) -> list[Task]:
    """The tasks of `slots`, in file order."""
    return [t for i, t in enumerate(tasks) if task_slot(i, len(tasks), num_slots) in slots]


class FileTasks:
    """The tasks of the slots held now, chosen by a selector (`task_selection.py`; default: cycled in
    file order, reshuffled every epoch). No slot (or only empty ones): no task."""

    def __init__(self, tasks: list[Task], shuffle: bool, seed: int, selector=None, stats: TaskStats | None = None):
        self.tasks = tasks
        self.selector = selector if selector is not None else Sequential(seed, shuffle)
        self.stats = stats if stats is not None else TaskStats()
        self._slots: frozenset[int] | None = None
        self._mine: list[Task] = []

    def take(self, n: int, slots: frozenset[int], num_slots: int) -> list[Task]:
        if slots != self._slots:  # a new list: selectors start over on a new pool
            self._slots, self._mine = slots, slot_tasks(self.tasks, slots, num_slots)
        return list(self.selector.select(self._mine, n, self.stats))[:n] if self._mine else []

    def close(self) -> None:
        pass


class TopicTasks:
    """Tasks from the tasks topic through the `<ns>.explorers` group (offsets auto-committed: a
    task lost to a crash is only a prompt, not a trajectory). The group shares the tasks out among
    the explorers present, so slots play no part here."""

    def __init__(self, kafka: KafkaConfig, namespace: str, on_bad=None):
        from streamrft.infra.kafka import make_consumer

        self.on_bad = on_bad
        self.consumer = make_consumer(kafka, f"{namespace}.explorers", **{"enable.auto.commit": True})
        self.consumer.subscribe([topic_name(namespace, "tasks")])

    def take(self, n: int, slots: frozenset[int] = frozenset(), num_slots: int = 0, timeout: float = 1.0) -> list[Task]:
        """Up to n tasks: what arrives within `timeout` (fewer, or none, when the topic runs dry)."""
        out = []
        for msg in self.consumer.consume(n, timeout=timeout):
            if msg.error() is not None:
                continue
            try:
                out.append(decode(msg.value(), Task))
            except DecodeError as e:
                if self.on_bad is not None:
                    self.on_bad(msg, e)
        return out

    def close(self) -> None:
        self.consumer.close()


def make_task_source(data: DataConfig, kafka: KafkaConfig, namespace: str, seed: int,
                     on_bad=None, selector=None, stats: TaskStats | None = None, media=None) -> FileTasks | TopicTasks:
    """Tasks of `data`: a file's through `selector` (default sequential) with `stats`, or the topic's in
    order. `media`: where a file's images are stored (`load_task_file`)."""
    if data.source == "topic":
        return TopicTasks(kafka, namespace, on_bad)
    if not data.train:
        raise ValueError("data.train must name a task file when data.source is 'file'")
    tasks = load_task_file(data.train, data.prompt_key, data.answer_key, media=media)
    return FileTasks(tasks, data.shuffle, seed, selector, stats)
