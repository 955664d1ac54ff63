"""Slot -> task sharding of a task file (pure logic; the Kafka membership is in test_membership)."""
from collections import Counter

from streamrft.producers.tasks import FileTasks, slot_tasks, task_slot
from streamrft.schemas import Task


def _tasks(n: int) -> list[Task]:
    return [Task(task_id=f"t{i}", prompt=f"p{i}") for i in range(n)]


def test_task_slot_cuts_the_file_into_equal_runs_and_spreads_a_short_file_over_every_slot():
    assert [task_slot(i, 10, 4) for i in range(10)] == [0, 0, 0, 1, 1, 2, 2, 2, 3, 3]
    assert [task_slot(i, 4, 8) for i in range(4)] == [0, 2, 4, 6]
    assert [task_slot(i, 3, 64) for i in range(3)] == [0, 21, 42]


def test_slot_shards_are_disjoint_cover_the_file_and_are_balanced():
    tasks = _tasks(300)
    halves = [frozenset(range(0, 32)), frozenset(range(32, 64))]
    shards = [slot_tasks(tasks, s, 64) for s in halves]
    ids = [{t.task_id for t in sh} for sh in shards]
    assert not ids[0] & ids[1]
    assert ids[0] | ids[1] == {t.task_id for t in tasks}
    assert [len(sh) for sh in shards] == [150, 150]
    thirds = [frozenset(range(0, 22)), frozenset(range(22, 43)), frozenset(range(43, 64))]
    sizes = [len(slot_tasks(tasks, s, 64)) for s in thirds]
    assert sizes == [104, 98, 98]  # 22, 21, 21 slots of 300/64 tasks each


def test_file_tasks_cycles_over_the_current_slots_and_follows_a_new_slot_set():
    tasks = _tasks(8)
    src = FileTasks(tasks, shuffle=True, seed=1)
    first = frozenset({0, 1})
    got = [t.task_id for t in src.take(6, first, 4)]
    # slots 0 and 1 of 4 hold tasks 0-3; an epoch is a permutation of them, then the next starts
    assert Counter(got[:4]) == Counter(["t0", "t1", "t2", "t3"])
    assert set(got[4:]) <= {"t0", "t1", "t2", "t3"}
    # the slots moved (another explorer joined): from now on only the new shard
    got = [t.task_id for t in src.take(5, frozenset({3}), 4)]
    assert set(got) == {"t6", "t7"}
    assert src.take(4, frozenset(), 4) == []   # no slot: no task


def test_file_tasks_without_shuffle_keeps_file_order():
    src = FileTasks(_tasks(6), shuffle=False, seed=0)
    assert [t.task_id for t in src.take(5, frozenset({0, 1, 2}), 3)] == ["t0", "t1", "t2", "t3", "t4"]
