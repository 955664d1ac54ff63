"""The parked groups and the ratings waiting for them: what is ready to score, and what timed out.

`FeedbackJoin` is plain state, folded from records in any order (a restarted joiner folds the
parked topic and the feedback topics from `earliest` and gets the same state):
- `park(group, parked_at)`: a group waiting for ratings. A trajectory answers to its own id, its
  episode's (`info.episode_id`) and the gateway completions it holds (`info.completion_ids`).
- `rate(feedback, now, team)`: a rating from `team`'s feedback topic. A `feedback_id` seen before
  is counted (`duplicate`) and ignored; a rating of a group already joined or timed out is counted
  (`late`) and never applied. A rating counts for a group of its own team, or of any team when its
  team is in `teams`; the others are counted when the group settles (`wrong_team`).
- `due(now)`: each parked group whose every trajectory has `min_rated` ratings (with the
  policy's aggregation, the reward of each trajectory), or whose `wait_s` has passed (no rewards:
  `on_timeout` decides). `settle(group_id)` closes a group once its outcome is durable.
- `agreement`: per rater, on the items other raters rated too, the summed distance of their value
  from the others' mean (filled as groups settle).
- `expire(now)`: ratings that rate nothing parked or settled for `wait_s` are counted
  (`unknown`) and dropped. A rating that arrives before its group waits for it meanwhile.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Literal

from streamrft.schemas import Feedback, RolloutGroup, Trajectory
from streamrft.stream_ops.feedback.aggregate import bradley_terry, majority_reward, mean_reward

Aggregate = Literal["mean", "majority", "bradley_terry"]


@dataclass(frozen=True)
class FeedbackPolicy:
    min_rated: int = 1
    """Ratings each trajectory needs (preferences it appears in, for `bradley_terry`)."""
    aggregate: Aggregate = "mean"
    wait_s: float = 600.0
    """A group waits this long after it was parked, a rating this long for its group."""
    labels: dict[str, float] = field(default_factory=dict)
    """Each allowed label's reward value, in tie-breaking order; a label outside it is not counted."""
    teams: tuple[str, ...] | None = None
    """Teams whose ratings count for every group; None: a group's own team only."""

    def allows(self, rater_team: str, group_team: str) -> bool:
        return rater_team == group_team or (self.teams is not None and rater_team in self.teams)


def answers_to(t: Trajectory) -> set[str]:
    """The ids a rating may name to rate trajectory `t`."""
    ids = {t.traj_id}
    episode = t.info.get("episode_id")
    if isinstance(episode, str):
        ids.add(episode)
    completions = t.info.get("completion_ids")
    if isinstance(completions, list):
        ids.update(c for c in completions if isinstance(c, str))
    return ids


@dataclass
class Parked:
    group: RolloutGroup
    parked_at: float
    keys: list[set[str]]
    """Per trajectory, the ids that rate it."""


@dataclass
class Outcome:
    group: RolloutGroup
    rewards: list[float] | None
    """One per trajectory; None: the group timed out."""
    ratings: int = 0


class FeedbackJoin:
    def __init__(self, policy: FeedbackPolicy):
        self.policy = policy
        self.parked: dict[str, Parked] = {}
        self.settled: set[str] = set()
        self._settled_ids: set[str] = set()  # the rated ids of settled groups
        self.ratings: dict[str, list[Feedback]] = defaultdict(list)  # rated id -> its ratings
        self.first_seen: dict[str, float] = {}  # rated id -> when its first rating came
        self.seen: set[str] = set()  # feedback ids
        self.team_of: dict[str, str] = {}  # feedback id -> the team whose topic carried it
        self.counters: Counter = Counter()
        self.agreement: dict[str, tuple[int, float]] = {}  # rater -> (items shared, summed |own - others' mean|)

    def park(self, group: RolloutGroup, parked_at: float) -> None:
        if group.group_id in self.parked or group.group_id in self.settled:
            self.counters["parked_twice"] += 1
            return
        self.parked[group.group_id] = Parked(group, parked_at, [answers_to(t) for t in group.trajectories])

    def rate(self, feedback: Feedback, now: float, team: str = "default") -> None:
        if feedback.feedback_id in self.seen:
            self.counters["duplicate"] += 1
            return
        self.seen.add(feedback.feedback_id)
        self.team_of[feedback.feedback_id] = team
        ids = feedback.rated()
        if any(i in self._settled_ids for i in ids):
            self.counters["late"] += 1
            return
        if feedback.label is not None and feedback.label not in self.policy.labels:
            self.counters["unknown_label"] += 1
            return
        for i in dict.fromkeys(ids):
            self.ratings[i].append(feedback)
            self.first_seen.setdefault(i, now)
        self.counters["ratings"] += 1

    def _of(self, keys: set[str], group_team: str, allowed: bool = True) -> list[Feedback]:
        """The distinct ratings naming any of `keys` that may rate a group of `group_team` (or,
        `allowed=False`, those that may not)."""
        found: dict[str, Feedback] = {}
        for k in keys:
            for f in self.ratings.get(k, ()):
                if self.policy.allows(self.team_of.get(f.feedback_id, ""), group_team) == allowed:
                    found.setdefault(f.feedback_id, f)
        return list(found.values())

    def rewards(self, p: Parked) -> tuple[list[float], int] | None:
        """Each trajectory's reward and the ratings used, once every trajectory has `min_rated`."""
        per = [self._of(keys, p.group.team) for keys in p.keys]
        policy = self.policy
        if policy.aggregate == "bradley_terry":
            per = [[f for f in fs if f.preference is not None] for fs in per]
            if min(len(fs) for fs in per) < policy.min_rated:
                return None
            owner = {k: i for i, keys in enumerate(p.keys) for k in keys}
            pairs = [(str(owner[f.preference.chosen]), str(owner[f.preference.rejected]))
                     for f in {f.feedback_id: f for fs in per for f in fs}.values()
                     if f.preference.chosen in owner and f.preference.rejected in owner]
            strength = bradley_terry([str(i) for i in range(len(per))], pairs)
            return [strength[str(i)] for i in range(len(per))], len(pairs)
        per = [[f for f in fs if f.preference is None] for fs in per]
        if policy.aggregate == "majority":
            per = [[f for f in fs if f.label is not None] for fs in per]
        if min(len(fs) for fs in per) < policy.min_rated:
            return None
        if policy.aggregate == "majority":
            values = [majority_reward([f.label for f in fs], policy.labels) for fs in per]
        else:
            values = [mean_reward([f.reward for f in fs if f.reward is not None],
                                  [f.label for f in fs if f.label is not None], policy.labels) for fs in per]
        return values, sum(len(fs) for fs in per)

    def due(self, now: float) -> list[Outcome]:
        out = []
        for p in self.parked.values():
            got = self.rewards(p)
            if got is not None:
                out.append(Outcome(p.group, got[0], got[1]))
            elif now - p.parked_at >= self.policy.wait_s:
                out.append(Outcome(p.group, None))
        return out

    def settle(self, group_id: str, timed_out: bool = False) -> None:
        p = self.parked.pop(group_id, None)
        if p is None:
            return
        self.settled.add(group_id)
        self.counters["timed_out" if timed_out else "joined"] += 1
        self.counters["wrong_team"] += len({f.feedback_id for keys in p.keys
                                            for f in self._of(keys, p.group.team, allowed=False)})
        for keys in p.keys:
            self._agreement(self._of(keys, p.group.team))
        for keys in p.keys:
            self._settled_ids |= keys
            for k in keys:
                self.ratings.pop(k, None)
                self.first_seen.pop(k, None)

    def _agreement(self, ratings: list[Feedback]) -> None:
        """Per rater, how far their value for one item (mean of their scalar ratings and labels'
        values) is from the mean of the other raters' values for it, on items two or more rated."""
        by_rater: dict[str, list[float]] = defaultdict(list)
        for f in ratings:
            if f.reward is not None:
                by_rater[f.rater].append(f.reward)
            elif f.label in self.policy.labels:
                by_rater[f.rater].append(self.policy.labels[f.label])
        if len(by_rater) < 2:
            return
        means = {r: sum(v) / len(v) for r, v in by_rater.items()}
        for rater, mine in means.items():
            others = [m for r, m in means.items() if r != rater]
            n, total = self.agreement.get(rater, (0, 0.0))
            self.agreement[rater] = (n + 1, total + abs(mine - sum(others) / len(others)))

    def expire(self, now: float) -> None:
        waiting = {k for p in self.parked.values() for keys in p.keys for k in keys}
        dropped: set[str] = set()
        for k, t in list(self.first_seen.items()):
            if k not in waiting and now - t >= self.policy.wait_s:
                dropped |= {f.feedback_id for f in self.ratings.pop(k, ())}
                del self.first_seen[k]
        self.counters["unknown"] += len(dropped)
