"""The join's state, hand-checked: ready when every trajectory has its ratings, in any order of
arrival; copies counted once; late and unknown ratings counted, never applied; timeouts."""
import pytest

from streamrft.schemas import Feedback, RolloutGroup, Task, Trajectory
from streamrft.stream_ops.feedback.join import FeedbackJoin, FeedbackPolicy

LABELS = {"good": 1.0, "bad": 0.0}


def _group(gid: str = "g", n: int = 2) -> RolloutGroup:
    trajs = [Trajectory(traj_id=f"{gid}-t{i}", group_id=gid, task_id="task", model_version=0, prompt_ids=[1],
                        response_ids=[2], logprobs=[-0.5], info={"episode_id": f"{gid}-e{i}"}) for i in range(n)]
    return RolloutGroup(group_id=gid, task=Task(task_id="task", prompt="p"), trajectories=trajs)


def _rate(target_id=None, fid=None, rater="ann", **kw) -> Feedback:
    extra = {} if fid is None else {"feedback_id": fid}
    return Feedback(target="trajectory", target_id=target_id, source="human", rater=rater, **extra, **kw)


def test_a_group_is_due_once_every_trajectory_has_its_ratings_in_any_order():
    join = FeedbackJoin(FeedbackPolicy(min_rated=2, labels=LABELS, wait_s=60))
    join.rate(_rate("g-t0", reward=1.0), now=0)  # before its group is parked: it waits
    join.park(_group(), parked_at=1)
    join.rate(_rate("g-e0", label="bad"), now=2)  # the episode's id rates its trajectory
    join.rate(_rate("g-t1", reward=0.25), now=2)
    assert join.due(3) == []  # g-t1 has one rating of two
    copy = _rate("g-t1", reward=0.75, fid="f-1")
    join.rate(copy, now=4)
    join.rate(copy, now=5)  # the same rating again: counted once
    (out,) = join.due(5)
    assert out.rewards == [pytest.approx(0.5), pytest.approx(0.5)] and out.ratings == 4  # (1+0)/2, (0.25+0.75)/2
    assert join.counters["duplicate"] == 1
    join.settle("g")
    join.rate(_rate("g-t0", reward=0.0), now=6)  # the group was joined: late, never applied
    assert join.due(6) == [] and join.counters["late"] == 1 and join.counters["joined"] == 1


def test_a_group_without_its_ratings_times_out_and_stray_ratings_expire():
    join = FeedbackJoin(FeedbackPolicy(min_rated=1, wait_s=10))
    join.park(_group(), parked_at=0)
    join.rate(_rate("g-t0", reward=1.0), now=1)
    join.rate(_rate("nobody", reward=1.0), now=1)
    assert join.due(9) == []
    (out,) = join.due(10)
    assert out.rewards is None
    join.settle("g", timed_out=True)
    join.expire(now=11)
    assert join.counters["timed_out"] == 1 and join.counters["unknown"] == 1
    assert not join.ratings and not join.parked


def test_majority_and_labels_outside_the_set():
    join = FeedbackJoin(FeedbackPolicy(min_rated=2, aggregate="majority", labels=LABELS))
    join.park(_group(n=1), parked_at=0)
    join.rate(_rate("g-t0", label="meh"), now=0)  # not an allowed label: counted, not applied
    join.rate(_rate("g-t0", reward=1.0), now=0)  # a scalar: no label for a majority
    join.rate(_rate("g-t0", label="bad"), now=0)
    assert join.due(0) == []
    join.rate(_rate("g-t0", label="bad"), now=0)
    (out,) = join.due(0)
    assert out.rewards == [0.0] and join.counters["unknown_label"] == 1


def test_preferences_give_bradley_terry_rewards_once_each_trajectory_was_compared():
    import math

    join = FeedbackJoin(FeedbackPolicy(min_rated=1, aggregate="bradley_terry"))
    join.park(_group(n=3), parked_at=0)

    def prefer(a, b):
        join.rate(Feedback(target="episode", preference={"chosen": a, "rejected": b}, source="human", rater="r"), now=0)

    prefer("g-e0", "g-e1")
    prefer("g-e0", "g-e1")
    prefer("g-e0", "g-e1")
    prefer("g-e1", "g-e0")
    assert join.due(0) == []  # the third was never compared
    prefer("g-e2", "elsewhere")  # compared, with an item of another group: not a pair here
    (out,) = join.due(0)
    # e0 over e1 3.5 to 1.5 (one virtual tie): log-strengths +-log(7/3)/2, e2 uncompared 0
    assert out.rewards == [pytest.approx(math.log(7 / 3) / 2, abs=1e-6), pytest.approx(-math.log(7 / 3) / 2, abs=1e-6),
                           pytest.approx(0.0, abs=1e-9)]


def test_another_teams_ratings_count_only_when_allowed_and_rater_agreement_on_shared_items():
    join = FeedbackJoin(FeedbackPolicy(min_rated=2, labels=LABELS, wait_s=60))
    join.park(_group(), parked_at=0)
    join.rate(_rate("g-t0", reward=1.0, rater="ann"), now=1)
    join.rate(_rate("g-t0", label="good", rater="bob"), now=1)  # 1.0
    join.rate(_rate("g-t1", reward=0.0, rater="ann"), now=1)
    join.rate(_rate("g-t1", reward=0.5, rater="bob"), now=1)
    join.rate(_rate("g-t1", reward=1.0, rater="eve"), now=1, team="blue")  # not the group's team
    (out,) = join.due(2)
    assert out.rewards == [1.0, 0.25]  # eve's 1.0 is not in t1's mean
    join.settle("g")
    assert join.counters["wrong_team"] == 1
    # ann and bob shared both items: |1 - 1| and |0 - 0.5|, each once
    assert join.agreement == {"ann": (2, 0.5), "bob": (2, 0.5)}
    open_join = FeedbackJoin(FeedbackPolicy(min_rated=1, teams=("blue",)))
    open_join.park(_group("h", n=1), parked_at=0)
    open_join.rate(_rate("h-t0", reward=0.3, rater="eve"), now=1, team="blue")
    assert open_join.due(1)[0].rewards == [0.3]
