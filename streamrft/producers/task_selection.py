"""Which of its tasks an explorer generates next: `sequential`, `random`, `difficulty`, or yours.

A selector is any object with `select(pool, n, stats) -> list[Task]`: `pool` is the tasks of the
slots the explorer holds now (a new list when they change), `n` how many to return (repeats
allowed), `stats` the run's per-task outcomes (`TaskStats`, folded from `<ns>.task-stats` by
`task_stats.py`, the same in every explorer). Yours: `explorer.task_selector: {import_path:
"pkg.mod:factory", params: {...}}`, called as `factory(seed=..., **params)` (docs/curriculum.md).
"""
from __future__ import annotations

import random
from collections import deque
from typing import Any, Callable, Sequence

from streamrft.config import DifficultyParams, TaskSelectorConfig
from streamrft.producers.once import OnceWindow
from streamrft.schemas import Task, TaskOutcome

UNSEEN_WEIGHT = 0.25
"""p(1-p) at p = 1/2: a task with no outcome yet weighs as much as the most learnable one."""


class TaskStats:
    """The newest `window` episode rewards of every task, from TaskOutcome records; each
    `group_id` counted once (a redelivered group's outcome is published again). Thread-safe
    enough for one writer and one reader: `add` replaces a task's tuple, `rewards` reads it."""

    def __init__(self, window: int = 64):
        self.window = window
        self._rewards: dict[str, deque[float]] = {}
        self._frozen: dict[str, tuple[float, ...]] = {}
        self._seen = OnceWindow()  # the newest group ids: a redelivered outcome counts once

    def add(self, outcome: TaskOutcome) -> bool:
        """Fold one group's outcome in; False when its group was counted already."""
        if not self._seen.add(outcome.group_id):
            return False
        kept = self._rewards.setdefault(outcome.task_id, deque(maxlen=self.window))
        kept.extend(outcome.rewards)
        self._frozen[outcome.task_id] = tuple(kept)
        return True

    def state(self) -> dict:
        """Everything folded so far, for a snapshot (`fold_snapshot.py`)."""
        return {"window": self.window, "rewards": {t: list(r) for t, r in self._rewards.items()},
                "seen": self._seen.state()}

    def restore(self, state: dict) -> None:
        """Start from a snapshot's `state()` (before any `add`)."""
        self._rewards = {t: deque(map(float, r), maxlen=self.window) for t, r in state["rewards"].items()}
        self._frozen = {t: tuple(r) for t, r in self._rewards.items()}
        self._seen = OnceWindow.from_state(state["seen"])

    def rewards(self, task_id: str) -> tuple[float, ...]:
        """The task's newest episode rewards, oldest first (empty: never scored)."""
        return self._frozen.get(task_id, ())

    @property
    def groups(self) -> int:
        return self._seen.count

    def __len__(self) -> int:
        return len(self._frozen)


class Sequential:
    """The pool in file order, cycled, reshuffled every epoch when `shuffle`; a new pool starts a new epoch."""

    def __init__(self, seed: int, shuffle: bool = True):
        self.rng, self.shuffle = random.Random(seed), shuffle
        self._pool: Sequence[Task] | None = None
        self._order: list[Task] = []
        self._pos = 0

    def select(self, pool: Sequence[Task], n: int, stats: TaskStats) -> list[Task]:
        if pool is not self._pool:
            self._pool, self._order, self._pos = pool, [], 0
        out = []
        while len(out) < n and pool:
            if self._pos == len(self._order):
                self._order, self._pos = list(pool), 0
                if self.shuffle:
                    self.rng.shuffle(self._order)
            out.append(self._order[self._pos])
            self._pos += 1
        return out


class Uniform:
    """Independent uniform draws from the pool, seeded."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)

    def select(self, pool: Sequence[Task], n: int, stats: TaskStats) -> list[Task]:
        return self.rng.choices(pool, k=n) if pool else []


def successes(rewards: Sequence[float], p: DifficultyParams) -> list[float]:
    """Each episode's success in [0, 1]: passed or not (`pass_threshold`), or with no threshold
    its reward clipped to [0, 1] (partial credit counts)."""
    if p.pass_threshold is None:
        return [min(max(r, 0.0), 1.0) for r in rewards]
    return [float(r >= p.pass_threshold) for r in rewards]


def difficulty_weight(rewards: Sequence[float], p: DifficultyParams) -> float:
    """A task's sampling weight from its newest episode rewards.

    After `min_attempts` episodes, a task that always or never succeeded keeps `skip_weight`;
    any other weighs p(1-p), p its success rate under a uniform Beta(1, 1) prior ((successes + 1)
    / (attempts + 2)), so an unseen task weighs 0.25 (explore it), and one solved 3 times in 4
    weighs 2/3 * 1/3 = 0.222. p(1-p) is the variance of a pass: GRPO's signal, zero when all agree.
    """
    if skipped(rewards, p):
        return p.skip_weight
    rate = (sum(successes(rewards, p)) + 1) / (len(rewards) + 2)
    return rate * (1 - rate)


def skipped(rewards: Sequence[float], p: DifficultyParams) -> bool:
    """At least `min_attempts` episodes, and every one of them succeeded, or none at all."""
    s = successes(rewards, p)
    return len(s) >= p.min_attempts and (min(s) >= 1.0 or max(s) <= 0.0)


class Difficulty:
    """Weighted draws by `difficulty_weight`: tasks solved about half the time come up most, those
    always or never solved hardly at all. Like prime-rl's easy/normal/hard pools (a group with
    zero advantage moves its problem to the easy or hard pool; pools sampled at set fractions) and
    Trinity-RFT's BOTS (Beta posteriors of success rates, targeting p* = 0.5), kept to one smooth
    weight with no pools to size. All skipped and `skip_weight` 0: uniform, rather than nothing."""

    def __init__(self, seed: int, **params: Any):
        self.rng = random.Random(seed)
        self.params = DifficultyParams.model_validate(params)
        self.skipped = 0  # tasks of the last pool at `skip_weight` (a metric)
        self._cache: dict[int, tuple[tuple[float, ...], float, bool]] = {}

    @property
    def window(self) -> int:
        return self.params.window

    def _judge(self, rewards: tuple[float, ...]) -> tuple[float, bool]:
        # cached by the rewards tuple itself: TaskStats replaces a task's tuple only when an outcome
        # arrives, so a shard of thousands of tasks costs one dict look-up per task and batch
        hit = self._cache.get(id(rewards))
        if hit is None or hit[0] is not rewards:
            hit = (rewards, difficulty_weight(rewards, self.params), skipped(rewards, self.params))
            self._cache[id(rewards)] = hit
        return hit[1], hit[2]

    def weights(self, pool: Sequence[Task], stats: TaskStats) -> list[float]:
        return [self._judge(stats.rewards(t.task_id))[0] for t in pool]

    def select(self, pool: Sequence[Task], n: int, stats: TaskStats) -> list[Task]:
        if not pool:
            return []
        if len(self._cache) > 4 * len(pool) + 1024:  # tuples replaced since: drop them
            self._cache.clear()
        judged = [self._judge(stats.rewards(t.task_id)) for t in pool]
        weights = [w for w, _ in judged]
        self.skipped = sum(skip for _, skip in judged)
        if sum(weights) <= 0:
            return self.rng.choices(pool, k=n)
        return self.rng.choices(pool, weights=weights, k=n)


SELECTORS: dict[str, Callable[..., Any]] = {
    "sequential": Sequential, "random": Uniform, "difficulty": Difficulty,
}
"""`explorer.task_selector.type` -> factory(seed, **params); names match `config.TASK_SELECTOR_TYPES`."""


def make_selector(cfg: TaskSelectorConfig, seed: int, shuffle: bool = True):
    """The configured selector; `shuffle` (`data.shuffle`) is the sequential one's."""
    if cfg.import_path:
        from streamrft.engine.algorithms.registry import resolve

        selector = resolve({}, None, cfg.import_path)(seed=seed, **cfg.params)
        if not callable(getattr(selector, "select", None)):
            raise ValueError(f"explorer.task_selector.import_path {cfg.import_path!r} made {type(selector).__name__}, "
                             f"which has no select(pool, n, stats)")
        return selector
    if cfg.type == "sequential":
        return Sequential(seed, shuffle)
    return SELECTORS[cfg.type](seed, **cfg.params)


def uses_stats(cfg: TaskSelectorConfig) -> bool:
    """Whether the explorer must read `<ns>.task-stats` for this selector (yours: always)."""
    return bool(cfg.import_path) or cfg.type == "difficulty"
