"""Task selectors and the per-task stats they read (pure: hand values and simulated outcomes)."""
import random
from collections import Counter

import pytest

from streamrft.config import ConfigError, DifficultyParams, TaskSelectorConfig, load_config
from streamrft.producers.task_selection import (Difficulty, Sequential, TaskStats, Uniform, difficulty_weight,
                                                make_selector, skipped)
from streamrft.producers.tasks import FileTasks
from streamrft.schemas import Task, TaskOutcome


def _tasks(*ids: str) -> list[Task]:
    return [Task(task_id=i, prompt=i) for i in ids]


def _outcome(task_id: str, rewards: list[float], group_id: str) -> TaskOutcome:
    return TaskOutcome(group_id=group_id, task_id=task_id, rewards=rewards)


def test_stats_count_each_group_once_and_keep_the_newest_window_of_episodes():
    stats = TaskStats(window=5)
    assert stats.add(_outcome("a", [1.0, 0.0, 1.0], "g1"))
    assert not stats.add(_outcome("a", [1.0, 0.0, 1.0], "g1"))  # a redelivered group
    assert stats.add(_outcome("a", [0.5, 0.25, 0.0], "g2"))
    assert stats.rewards("a") == (0.0, 1.0, 0.5, 0.25, 0.0)  # the oldest episode forgotten
    assert stats.rewards("b") == ()
    assert (stats.groups, len(stats)) == (2, 1)


def test_difficulty_weight_by_hand():
    p = DifficultyParams(min_attempts=4, pass_threshold=1.0, window=8, skip_weight=0.01)
    assert difficulty_weight((), p) == 0.25                                    # unseen: p = 1/2
    assert difficulty_weight((1.0, 1.0, 0.5, 1.0), p) == pytest.approx(2 / 9)  # 3 of 4: p = 4/6
    assert difficulty_weight((1.0, 1.0, 1.0), p) == pytest.approx(0.16)        # 3 of 3, under min_attempts: p = 4/5
    assert difficulty_weight((1.0,) * 4, p) == 0.01                            # always solved: skipped
    assert difficulty_weight((0.0, 0.9, 0.5, 0.0), p) == 0.01                  # never solved (0.9 < 1.0)
    assert skipped((0.0,) * 4, p) and not skipped((0.0,) * 3, p) and not skipped((0.0, 1.0, 0.0, 0.0), p)
    lenient = DifficultyParams(min_attempts=4, pass_threshold=0.5, window=8)
    assert difficulty_weight((0.0, 0.9, 0.5, 0.0), lenient) == pytest.approx(0.25)  # 2 of 4: p = 3/6
    credit = DifficultyParams(min_attempts=4, pass_threshold=None, window=8)  # partial credit counts
    assert difficulty_weight((0.25, 0.25, 0.5, 0.0), credit) == pytest.approx(2 / 6 * 4 / 6)  # p = (1 + 1) / 6
    assert difficulty_weight((1.0, 2.0, 1.0, 1.0), credit) == 0.01 and difficulty_weight((0.0, -1.0, 0.0, 0.0), credit) == 0.01
    assert difficulty_weight((0.0, 0.1, 0.0, 0.0), credit) == pytest.approx(1.1 / 6 * 4.9 / 6)  # a little credit: kept


def test_sequential_is_the_file_in_order_and_random_is_seeded():
    pool = _tasks("t0", "t1", "t2")
    seq = Sequential(seed=0, shuffle=False)
    assert [t.task_id for t in seq.select(pool, 5, TaskStats())] == ["t0", "t1", "t2", "t0", "t1"]
    draws = [[t.task_id for t in Uniform(seed=7).select(pool, 20, TaskStats())] for _ in range(2)]
    assert draws[0] == draws[1] and set(draws[0]) == {"t0", "t1", "t2"}
    assert Uniform(seed=7).select([], 3, TaskStats()) == []


def test_difficulty_shifts_sampling_to_the_learnable_tasks_as_outcomes_come_in():
    """Simulated run: 10 trivial tasks (always solved), 10 impossible (never), 10 learnable (half the
    time). Before any outcome all 30 are drawn alike; once each has been tried, learnable ones are
    ~90% of the draws (weights 0.25 vs 0.01: 10 * 0.25 / (10 * 0.25 + 20 * 0.01) = 0.926)."""
    kinds = {f"{k}{i}": k for k in ("trivial", "impossible", "learnable") for i in range(10)}
    solve = {"trivial": 1.0, "impossible": 0.0, "learnable": 0.5}
    pool, stats, rng = _tasks(*kinds), TaskStats(window=64), random.Random(0)
    sel = Difficulty(seed=1, min_attempts=16, window=64, skip_weight=0.01)
    first = Counter(kinds[t.task_id] for t in sel.select(pool, 3000, stats))
    assert all(900 <= c <= 1100 for c in first.values()), first  # no outcome yet: uniform
    picked, groups = Counter(), 0
    for _ in range(400):  # batches of 4 tasks x 8 episodes, their outcomes fed back
        for task in sel.select(pool, 4, stats):
            groups += 1
            rewards = [float(rng.random() < solve[kinds[task.task_id]]) for _ in range(8)]
            stats.add(_outcome(task.task_id, rewards, f"g{groups}"))
            picked[kinds[task.task_id]] += 1
    late = Counter(kinds[t.task_id] for t in sel.select(pool, 4000, stats))
    assert late["learnable"] / 4000 > 0.85, late
    assert sel.skipped == 20
    assert picked["learnable"] > 2 * (picked["trivial"] + picked["impossible"]), picked
    # the plain selectors on the same pool: a third each
    plain = Counter(kinds[t.task_id] for t in Uniform(seed=1).select(pool, 3000, stats))
    assert 0.28 < plain["learnable"] / 3000 < 0.39


def test_difficulty_falls_back_to_uniform_when_every_task_is_skipped_and_skip_weight_is_0():
    pool, stats = _tasks("a", "b"), TaskStats()
    for i, t in enumerate(("a", "b")):
        stats.add(_outcome(t, [1.0] * 16, f"g{i}"))
    got = Counter(t.task_id for t in Difficulty(seed=0, skip_weight=0.0).select(pool, 200, stats))
    assert set(got) == {"a", "b"}


class Firsts:
    """A user's selector (import_path): always the pool's first `n`."""

    def __init__(self, seed: int, offset: int = 0):
        self.offset = offset

    def select(self, pool, n, stats):
        return list(pool[self.offset:self.offset + n])


def test_file_tasks_use_the_configured_selector_and_a_users_by_import_path():
    tasks = _tasks(*(f"t{i}" for i in range(8)))
    cfg = TaskSelectorConfig(import_path=f"{__name__}:Firsts", params={"offset": 1})
    src = FileTasks(tasks, shuffle=True, seed=0, selector=make_selector(cfg, seed=0))
    assert [t.task_id for t in src.take(2, frozenset({0, 1}), 4)] == ["t1", "t2"]
    assert isinstance(make_selector(TaskSelectorConfig(type="random"), seed=0), Uniform)
    with pytest.raises(ValueError, match="does not name a callable"):
        make_selector(TaskSelectorConfig(import_path=f"{__name__}:nothing_here"), seed=0)


@pytest.mark.parametrize("override, words", [
    ("explorer.task_selector={type: curriculum}", ["explorer.task_selector.type", "'sequential'", "'difficulty'"]),
    ("explorer.task_selector={type: difficulty, params: {min_attempts: 0}}", ["params.min_attempts", ">= 1"]),
    ("explorer.task_selector={type: difficulty, params: {min_attempts: 80}}", ["min_attempts=80", "window=64"]),
    ("explorer.task_selector={type: difficulty, params: {k: 3}}", ["params.k", "min_attempts", "skip_weight"]),
    ("explorer.task_selector={type: random, params: {k: 3}}", ["'random' selector takes none"]),
])
def test_bad_selector_config_names_the_field_and_the_allowed(override, words):
    with pytest.raises(ConfigError) as e:
        load_config("examples/cpu_demo.yaml", [override])
    assert all(w in str(e.value) for w in words), str(e.value)


def test_a_selector_other_than_sequential_needs_a_task_file():
    with pytest.raises(ConfigError, match="needs data.source='file'"):
        load_config("examples/cpu_demo.yaml", ["data.source=topic", "explorer.task_selector.type=random"])
