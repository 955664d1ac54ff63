from streamrft.consumers.admission import Counts, SeenWindow, admit_trajectories, is_fresh, staleness
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
    trajs = [_t("a", 4), _t("b", 4), _t("b", 4), _t("c", 1), _t("d", 5)]
    keep = admit_trajectories(trajs, trainer_version=5, max_staleness=2, seen=seen, counts=counts)
    assert keep == [1, 4]
    assert (counts.duplicate, counts.stale) == (2, 1)


def test_window_forgets_only_ids_that_would_be_stale_anyway():
    seen = SeenWindow({"old": 2, "edge": 3, "new": 5})
    seen.prune(trainer_version=5, max_staleness=2)
    assert set(seen.ids) == {"edge", "new"}
