"""The explorers' folds of `<ns>.admission` and `<ns>.task-stats` restart from a snapshot and the
records after it (`producers/fold_snapshot.py`), and reach the same state as a fold from offset 0
of the same log.

On the real stack: a log written by the project's producer; a process folds it with snapshots on and
is killed -9 after writing one, more records follow; a new fold from the snapshot and a fold from
offset 0 must agree, and the first must have read only the records after the snapshot.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from streamrft.infra.kafka import ensure_topics, flush_or_raise, make_producer, run_topics
from streamrft.producers.admission_log import SNAPSHOT as ADMISSION
from streamrft.producers.admission_log import AdmissionLog
from streamrft.producers.fold_snapshot import FoldSnapshots
from streamrft.producers.task_selection import TaskStats
from streamrft.producers.task_stats import SNAPSHOT as TASK_STATS
from streamrft.producers.task_stats import TaskStatsReader
from streamrft.schemas import ExplorerLedger, GroupDropped, TaskOutcome, encode, topic_name
from tests_helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]

FOLD_AND_SNAPSHOT = """
import json, sys, time
from streamrft.config import KafkaConfig, S3Config
from streamrft.producers.admission_log import AdmissionLog
from streamrft.producers.fold_snapshot import FoldSnapshots
from streamrft.producers.task_selection import TaskStats
from streamrft.producers.task_stats import TaskStatsReader
a = json.loads(sys.argv[1])
kafka, s3 = KafkaConfig(**a["kafka"]), S3Config(**a["s3"])
AdmissionLog(kafka, a["ns"], "killed", snapshots=FoldSnapshots(s3, a["ns"], every_s=0, min_records=50)).start()
TaskStatsReader(kafka, a["ns"], TaskStats(8), FoldSnapshots(s3, a["ns"], every_s=0, min_records=50)).start()
time.sleep(600)
"""


def _write(kafka, ns: str, start: int, n: int) -> None:
    producer = make_producer(kafka)
    for i in range(start, start + n):
        explorer = f"explorer-{i % 5}"
        producer.produce(topic_name(ns, "admission"), key=explorer.encode(),
                         value=encode(ExplorerLedger(explorer_id=explorer, produced=i // 5, in_flight=i % 3,
                                                     in_flight_version=i // 50)))
        gid = f"g{i // 2}"  # every drop and outcome twice: counted once
        producer.produce(topic_name(ns, "admission"), key=gid.encode(),
                         value=encode(GroupDropped(group_id=gid, reason="filtered", role="stream_ops")))
        producer.produce(topic_name(ns, "task-stats"), key=gid.encode(),
                         value=encode(TaskOutcome(group_id=gid, task_id=f"t{i % 7}", rewards=[i % 2, 1.0])))
        if i % 100 == 99:
            flush_or_raise(producer)
    flush_or_raise(producer)


def _snapshot_next(snaps: FoldSnapshots, name: str) -> int:
    snap = snaps.load(name)
    return sum(snap[0].values()) if snap else 0


def test_folds_restarted_from_a_snapshot_after_a_kill_equal_folds_from_offset_0(stack, namespace):
    kafka = stack.kafka.model_copy(update={"partitions": 1})
    ensure_topics(kafka, run_topics(kafka, namespace))
    _write(kafka, namespace, 0, 600)  # 1,200 admission records, 600 task outcomes
    args = json.dumps({"kafka": kafka.model_dump(), "s3": stack.s3.model_dump(), "ns": namespace})
    proc = subprocess.Popen([sys.executable, "-c", FOLD_AND_SNAPSHOT, args], cwd=ROOT)
    snaps = FoldSnapshots(stack.s3, namespace)
    try:
        wait_for(lambda: _snapshot_next(snaps, ADMISSION) >= 1200 and _snapshot_next(snaps, TASK_STATS) >= 600,
                 90, "the killed process's snapshots")
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    _write(kafka, namespace, 600, 100)  # the tail after the snapshots
    snapped = {ADMISSION: _snapshot_next(snaps, ADMISSION), TASK_STATS: _snapshot_next(snaps, TASK_STATS)}

    restored = AdmissionLog(kafka, namespace, "restored", snapshots=FoldSnapshots(stack.s3, namespace, every_s=1e9))
    restored_stats = TaskStats(8)
    restored_reader = TaskStatsReader(kafka, namespace, restored_stats, FoldSnapshots(stack.s3, namespace, every_s=1e9))
    whole = AdmissionLog(kafka, namespace, "from-zero")
    whole_stats = TaskStats(8)
    whole_reader = TaskStatsReader(kafka, namespace, whole_stats)
    try:
        for fold in (restored, whole):
            fold.start()
            wait_for(fold.caught_up.is_set, 60, "the ledger read back")
        # both have read the whole log: the 700th round's records came before their own first ledger
        for reader in (restored_reader, whole_reader):
            reader.start()
        wait_for(lambda: restored_stats.groups == whole_stats.groups == 350, 60, "every outcome folded")
        wait_for(lambda: restored.counts()[1] == whole.counts()[1] == 350, 60, "every drop folded")
        with restored._lock, whole._lock:
            a, b = restored.state(), whole.state()
        for state in (a, b):
            for own in ("restored", "from-zero", "killed"):
                state["ledgers"].pop(own, None)
        assert a == b
        assert a["ledgers"]["explorer-4"] == [699 // 5, 699 % 3, 699 // 50]
        assert restored_stats.state() == whole_stats.state()
        # neither restored fold read from offset 0: only what came after its snapshot (plus the
        # ledgers the three processes published)
        assert restored.folded <= 1400 - snapped[ADMISSION] + 10 < whole.folded
        assert restored_reader.folded == 700 - snapped[TASK_STATS] < whole_reader.folded == 700
    finally:
        for reader in (restored_reader, whole_reader):
            reader.stop()
        for fold in (restored, whole):
            fold.stop()


def test_task_stats_state_round_trips():
    stats = TaskStats(window=3)
    for i in range(5):
        stats.add(TaskOutcome(group_id=f"g{i}", task_id="t", rewards=[float(i)]))
    copy = TaskStats(window=3)
    copy.restore(json.loads(json.dumps(stats.state())))
    assert copy.rewards("t") == (2.0, 3.0, 4.0) and copy.groups == 5
    assert not copy.add(TaskOutcome(group_id="g1", task_id="t", rewards=[9.0]))  # seen before the snapshot
