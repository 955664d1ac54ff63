from streamrft.consumers.admission import Counts, SeenWindow, admit_trajectories, is_fresh, oldest_head, staleness
from streamrft.schemas import Trajectory


def _t(tid: str, version: int) -> Trajectory:
    return Trajectory(traj_id=tid, group_id="g", task_id="t", model_version=version, prompt_ids=[1],
                      response_ids=[2], logprobs=[-0.1])


def test_staleness_rule_counts_queue_time():
    assert staleness(7, 5) == 2
    assert is_fresh(7, 5, 2) and not is_fresh(7, 4, 2)
    assert is_fresh(3, 3, 0) and not is_fresh(3, 2, 0)
    assert not is_fresh(3, 4, 5)  # from the future: a trainer restored to an older checkpoint


def test_admit_drops_duplicates_and_stale_and_counts_them():
    seen = SeenWindow()
    seen.add("a", 4)
    counts = Counts()
    trajs = [_t("a", 4), _t("b", 4), _t("b", 4), _t("d", 5)]
    keep = admit_trajectories(trajs, trainer_version=5, max_staleness=2, seen=seen, counts=counts)
    assert keep == [1, 3]
    assert (counts.duplicate, counts.stale, counts.stale_groups) == (2, 0, 0)


def test_a_group_with_one_stale_trajectory_is_dropped_whole():
    # an episode of the group started on v1 (weights swapped while the others ran): at v5 with
    # max_staleness 2 it is stale, and the group's advantages were normalised over all four
    seen, counts, batch = SeenWindow(), Counts(), set()
    seen.add("a", 4)
    trajs = [_t("a", 4), _t("b", 4), _t("c", 1), _t("d", 5)]
    assert admit_trajectories(trajs, trainer_version=5, max_staleness=2, seen=seen, counts=counts,
                              batch_ids=batch) == []
    assert (counts.duplicate, counts.stale, counts.stale_groups) == (1, 3, 1)
    assert batch == set()  # nothing of it joined the batch
    assert admit_trajectories(trajs[:2] + trajs[3:], 5, 2, seen, counts, batch) == [1, 2]  # fresh ones alone


def test_window_forgets_only_ids_that_would_be_stale_anyway():
    seen = SeenWindow({"old": 2, "edge": 3, "new": 5})
    seen.prune(trainer_version=5, max_staleness=2)
    assert set(seen.ids) == {"edge", "new"}


def test_a_group_delivered_twice_into_one_batch_is_admitted_once():
    seen, counts, batch = SeenWindow(), Counts(), set()
    group_a = [_t("a1", 3), _t("a2", 3)]
    assert admit_trajectories(group_a, 3, 1, seen, counts, batch) == [0, 1]
    assert admit_trajectories([_t("b1", 3)], 3, 1, seen, counts, batch) == [0]
    assert admit_trajectories(group_a, 3, 1, seen, counts, batch) == []  # A again, nothing trained yet
    assert (counts.duplicate, batch) == (2, {"a1", "a2", "b1"})


def test_a_forgotten_id_is_stale_whenever_a_copy_of_it_comes_back():
    """Pruning is safe because the trainer's version never goes down: a copy of an id that the
    window forgot at version v is dropped as stale at v and at every later version."""
    for max_staleness in (0, 1, 3):
        for v in range(8):
            for model_version in range(v + 1):
                seen = SeenWindow({"x": model_version})
                seen.prune(v, max_staleness)
                if "x" not in seen:
                    assert not any(is_fresh(later, model_version, max_staleness) for later in range(v, v + 10))


def test_replay_forgets_nothing():
    seen = SeenWindow({"old": 0})
    seen.prune(trainer_version=100, max_staleness=None)
    assert "old" in seen


def test_oldest_head_takes_the_oldest_weights_first_across_partitions_and_keeps_each_partition_in_order():
    parts = ["p0", "p0", "p1", "p2", "p1"]
    versions = [5, 3, 4, 4, 2]  # p0: v5 then v3; p1: v4 then v2; p2: v4
    assert oldest_head(parts, versions.__getitem__) == 2   # heads are v5 (0), v4 (2), v4 (3): the first v4
    assert oldest_head(["p0", "p1"], [7, -1].__getitem__) == 1  # an unreadable record goes first (dead letter)
    assert oldest_head(["p0", "p0"], [9, 1].__getitem__) == 0   # never past a partition's first record
    order, left = [], list(zip(parts, versions))
    while left:  # draining: v4 (p1), v2 (p1 behind it), v4 (p2), v5 (p0), v3 (p0)
        i = oldest_head([p for p, _ in left], lambda i: left[i][1])
        order.append(left.pop(i))
    assert order == [("p1", 4), ("p1", 2), ("p2", 4), ("p0", 5), ("p0", 3)]
