"""Prioritised experience replay inside an online run (`trainer.replay_buffer`; not `trainer.replay`,
which re-reads another run's log as an offline dataset).

Every fresh group the trainer trains joins a bounded buffer with a priority (`PRIORITIES`, or the
user's `import_path` function of an ExperienceGroup). Each step draws `replay_groups` distinct
groups with P(i) = p_i^alpha / sum p^alpha and gives their trajectories the importance weight
(N P(i))^-beta / max_j (N P(j))^-beta (Schaul et al. 2016), beta annealed to `beta_final`; fresh
samples weigh 1. A group leaves after `max_reuse` replays, when older than `max_staleness`
versions, or first-in first-out past `capacity`. The buffer is part of every checkpoint as
(topic, partition, offset, reuse count, priority, kept trajectories): `restore` re-reads those
records from the log by offset, so a crash loses nothing. Pure maths at the top, unit-tested.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from streamrft.schemas import ExperienceGroup

log = logging.getLogger(__name__)


# ---- pure maths --------------------------------------------------------------------------------
def abs_advantage(advantages: list[float]) -> float:
    """Mean |advantage| of a group: how much the group still has to teach."""
    return sum(abs(a) for a in advantages) / len(advantages)


def reward_std(rewards: list[float]) -> float:
    """Population standard deviation of the group's rewards (0 for a group all alike)."""
    mean = sum(rewards) / len(rewards)
    return math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))


def td_error(token_abs_advantages: list[float]) -> float:
    """Mean over the group's trajectories of their mean |token advantage| as the trainer computed it
    on the group's last use (with a GAE critic: discounted sums of TD errors), refreshed on every use."""
    return sum(token_abs_advantages) / len(token_abs_advantages)


PRIORITIES = ("abs_advantage", "reward_std", "td_error")


def probabilities(priorities: list[float], alpha: float, epsilon: float) -> list[float]:
    """P(i) = (p_i + epsilon)^alpha / sum_j (p_j + epsilon)^alpha; alpha 0 = uniform."""
    scaled = [(p + epsilon) ** alpha for p in priorities]
    total = sum(scaled)
    return [s / total for s in scaled]


def importance_weights(probs: list[float], drawn: list[int], beta: float) -> list[float]:
    """(N P(i))^-beta of the drawn entries, divided by the largest weight any entry could get
    (that of the least probable one), so weights are in (0, 1] and only ever scale updates down."""
    n = len(probs)
    top = (n * min(probs)) ** -beta
    return [(n * probs[i]) ** -beta / top for i in drawn]


def annealed_beta(beta: float, beta_final: float, anneal_steps: int, step: int) -> float:
    """Linear from `beta` at step 0 to `beta_final` at `anneal_steps` (0: `beta` throughout)."""
    if anneal_steps <= 0:
        return beta
    return beta + (beta_final - beta) * min(1.0, step / anneal_steps)


def draw(probs: list[float], k: int, generator: torch.Generator) -> list[int]:
    """k distinct indices drawn in proportion to `probs` (all of them when k >= len(probs))."""
    k = min(k, len(probs))
    if k == 0:
        return []
    return torch.multinomial(torch.tensor(probs, dtype=torch.double), k, replacement=False,
                             generator=generator).tolist()


# ---- the buffer --------------------------------------------------------------------------------
@dataclass
class Entry:
    topic: str
    partition: int
    offset: int
    keep: list[int]          # indices of the group's trajectories trained on first use
    version: int             # the group's oldest model_version (for max_staleness)
    priority: float
    reuse: int = 0           # replays so far
    group: ExperienceGroup | None = None  # in memory only; re-read from the log on restore

    def member(self) -> dict:
        """What a checkpoint keeps of this entry (JSON)."""
        return {"topic": self.topic, "partition": self.partition, "offset": self.offset, "keep": self.keep,
                "version": self.version, "priority": self.priority, "reuse": self.reuse}


def resolve_priority(name: str, import_path: str | None) -> Callable[[ExperienceGroup, list[float] | None], float]:
    """(group, per-trajectory mean |token advantage| of its last use or None) -> priority."""
    from streamrft.engine.algorithms.registry import resolve

    if import_path:
        user = resolve({}, None, import_path)
        return lambda eg, _token_adv: float(user(eg))
    table = {
        "abs_advantage": lambda eg, _token_adv: abs_advantage(eg.advantages),
        "reward_std": lambda eg, _token_adv: reward_std(eg.rewards),
        "td_error": lambda eg, token_adv: td_error(token_adv) if token_adv else abs_advantage(eg.advantages),
    }
    return resolve(table, name)


class ReplayBuffer:
    """`add` after a fresh group's step, `sample` for the next batch, `members`/`restore` for checkpoints."""

    def __init__(self, cfg, seed: int):
        self.cfg, self.seed = cfg, seed
        self.entries: list[Entry] = []  # oldest first
        self.priority_of = resolve_priority(cfg.priority, cfg.import_path)

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, topic: str, partition: int, offset: int, eg: ExperienceGroup, keep: list[int],
            token_adv: list[float] | None = None) -> None:
        version = min(eg.trajectories[i].model_version for i in keep)
        prio = self.priority_of(eg, token_adv)
        if not math.isfinite(prio) or prio < 0:
            log.warning("group %s: priority %s is not a finite non-negative number; not buffered", eg.group_id, prio)
            return
        self.entries.append(Entry(topic, partition, offset, list(keep), version, prio, group=eg))
        del self.entries[:max(0, len(self.entries) - self.cfg.capacity)]  # first in, first out

    def evict_stale(self, trainer_version: int) -> None:
        oldest = trainer_version - self.cfg.max_staleness
        self.entries = [e for e in self.entries if e.version >= oldest]

    def sample(self, trainer_version: int, step: int) -> list[tuple[Entry, float]]:
        """Up to `replay_groups` (entry, importance weight) drawn for `step`; the same buffer and step
        draw the same entries (a step redone after a crash replays what it replayed before). Each
        drawn entry's reuse count goes up; one at `max_reuse` leaves the buffer."""
        self.evict_stale(trainer_version)
        if not self.entries:
            return []
        cfg = self.cfg
        probs = probabilities([e.priority for e in self.entries], cfg.alpha, cfg.epsilon)
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step + 7)
        drawn = draw(probs, cfg.replay_groups, gen)
        beta = annealed_beta(cfg.beta, cfg.beta_final, cfg.beta_anneal_steps, step)
        weights = importance_weights(probs, drawn, beta)
        out = [(self.entries[i], w) for i, w in zip(drawn, weights)]
        for e, _ in out:
            e.reuse += 1
        self.entries = [e for e in self.entries if e.reuse < cfg.max_reuse]
        return out

    def reprioritise(self, entry: Entry, token_adv: list[float] | None) -> None:
        """A replayed group's priority after its new use (td_error changes as the critic learns)."""
        prio = self.priority_of(entry.group, token_adv)
        if math.isfinite(prio) and prio >= 0:
            entry.priority = prio

    def members(self) -> list[dict]:
        return [e.member() for e in self.entries]

    def restore(self, members: list[dict], read: Callable[[list[tuple[str, int, int]]], dict]) -> None:
        """Rebuild from a checkpoint's `members`; `read(locations)` returns {(topic, partition, offset):
        ExperienceGroup} read from the log. A record the log no longer holds (retention) is left out."""
        found = read([(m["topic"], m["partition"], m["offset"]) for m in members]) if members else {}
        self.entries = []
        for m in members:
            eg = found.get((m["topic"], m["partition"], m["offset"]))
            if eg is None:
                log.warning("replay buffer: %s[%d]@%d is gone from the log; not restored", m["topic"],
                            m["partition"], m["offset"])
                continue
            self.entries.append(Entry(**m, group=eg))
