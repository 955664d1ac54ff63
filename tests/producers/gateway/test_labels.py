"""The labelling page's queue (`producers/gateway/labels.py`): oldest parked first, one rater an
answer at a time unless overlap is asked for, leases that lapse, teams that may rate."""
from __future__ import annotations

from streamrft.producers.gateway.labels import LabelQueue
from streamrft.schemas import ParkedGroup, RolloutGroup, Task, Trajectory


def parked(gid: str, at: float, n: int = 2, team: str = "red") -> ParkedGroup:
    task = Task(task_id=f"t-{gid}", prompt=f"prompt {gid}", answer="")
    trajs = [Trajectory(traj_id=f"{gid}-{i}", group_id=gid, task_id=task.task_id, team=team, model_version=0,
                        prompt_ids=[1], response_ids=[2], logprobs=[-0.1], response_text=f"{gid} answer {i}")
             for i in range(n)]
    return ParkedGroup(group=RolloutGroup(group_id=gid, team=team, task=task, trajectories=trajs), parked_at=at,
                       source_topic="ns.rollouts.red")


def test_two_raters_never_get_the_same_answer_and_the_oldest_comes_first():
    q = LabelQueue(overlap=1, lease_s=60)
    q.park(parked("new", at=200.0))
    q.park(parked("old", at=100.0))
    ann, bob = q.next("red/ann", "red", 0.0), q.next("red/bob", "red", 0.0)
    assert (ann.traj_id, bob.traj_id) == ("old-0", "old-1")
    assert q.next("red/ann", "red", 1.0).traj_id == "old-0"  # what she holds, until she rates it
    q.rated("red/ann", "old-0")
    assert q.next("red/ann", "red", 2.0).traj_id == "new-0"
    assert q.counts(2.0) == {"waiting": 3, "held": 2, "rated": 1}
    # bob's lease lapses: old-1 goes to whoever asks next
    assert q.next("red/cat", "red", 61.0).traj_id == "old-1"
    q.settle("old")
    assert [a for a in q.answers] == ["new-0", "new-1"]
    q.park(parked("old", at=100.0))  # parked again (a redelivery) after it was settled: not shown
    assert "old-0" not in q.answers


def test_overlap_shows_an_answer_to_that_many_raters_each_once():
    q = LabelQueue(overlap=2, lease_s=60)
    q.park(parked("g", at=1.0, n=1))
    assert q.next("red/ann", "red", 0.0).traj_id == "g-0"
    assert q.next("red/bob", "red", 0.0).traj_id == "g-0"
    assert q.next("red/cat", "red", 0.0) is None  # two hold it
    q.rated("red/ann", "g-0")
    q.rated("red/ann", "g-0")  # twice from one rater counts once
    assert q.next("red/ann", "red", 1.0) is None and q.counts(1.0)["rated"] == 1
    q.rated("red/bob", "g-0")
    assert q.counts(1.0) == {"waiting": 0, "held": 0, "rated": 2}


def test_a_team_sees_only_the_groups_it_may_rate():
    q = LabelQueue(may_rate=lambda rater_team, group_team: rater_team == group_team)
    q.park(parked("r", at=1.0, team="red"))
    assert q.next("blue/ann", "blue", 0.0) is None
    assert q.next("red/ann", "red", 0.0).traj_id == "r-0"


def test_a_pair_is_two_answers_of_one_group_leased_together():
    q = LabelQueue(overlap=1, lease_s=60)
    q.park(parked("solo", at=1.0, n=1))
    q.park(parked("duo", at=2.0, n=3))
    a, b = q.next_pair("red/ann", "red", 0.0)
    assert (a.traj_id, b.traj_id) == ("duo-0", "duo-1")  # the group of one answer cannot make a pair
    assert q.next_pair("red/ann", "red", 1.0) == (a, b)  # what she holds
    assert q.next_pair("red/bob", "red", 1.0) is None  # duo-2 alone is left open for him
    assert q.next("red/bob", "red", 1.0).traj_id == "solo-0"
    q.rated("red/ann", "duo-0")
    q.rated("red/ann", "duo-1")
    assert q.next_pair("red/ann", "red", 2.0) is None
