"""Admission control on the real stack: `streamrft run` with the tiny demo model, where explorers
are far faster than the trainer (a version costs a checkpoint and an S3 upload), so without a
global bound their queue would grow and age out.

Checks: few trajectories are dropped stale (the run's `stale_pct`); explorers waited; the admission
topic accounts for every group (the explorers' ledgers add up to the groups on the rollouts topic,
and every dropped group it names was filtered by stream ops or dropped stale by the trainer); and
what was generated stayed within AReaL's bound of the final version.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from streamrft.config import load_config
from streamrft.schemas import ExperienceGroup, ExplorerLedger, GroupDropped, RolloutGroup, decode, topic_name
from tests_helpers import demo_overrides, read_all

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "cpu_demo.yaml"

pytestmark = pytest.mark.slow


def test_a_slow_trainer_makes_explorers_wait_instead_of_generating_stale_groups(stack, tmp_path):
    steps, explorers = 8, 2
    res = subprocess.run([sys.executable, "-m", "streamrft.cli", "run", str(DEMO),
                          *demo_overrides(stack, tmp_path, [f"trainer.max_steps={steps}", "eval.every_versions=0",
                                                            f"explorer.num_explorers={explorers}"])],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    final = next(line for line in res.stdout.splitlines() if line.startswith("final:"))
    fields = dict(kv.split("=") for kv in final.removeprefix("final: ").split())
    print(final)
    assert int(fields["versions"]) == steps and int(fields["trained"]) > 0
    assert float(fields["stale_pct"]) <= 10.0, final

    run_dir = next(p for p in tmp_path.iterdir() if (p / "config.yaml").exists())
    cfg = load_config(run_dir / "config.yaml")
    ns, tc = cfg.namespace, cfg.trainer
    waits = [int(m) for f in (run_dir / "logs").glob("explorer-*.log")
             for m in re.findall(r"'admission_waits': (\d+)", f.read_text())]
    assert len(waits) == explorers and sum(waits) > 0, "the explorers never waited: the trainer was not the slower side"

    ledgers, dropped = {}, {}
    for m in read_all(stack.kafka, topic_name(ns, "admission")):
        record = decode(m.value())
        if isinstance(record, ExplorerLedger):
            ledgers[record.explorer_id] = record
        else:
            assert isinstance(record, GroupDropped)
            dropped.setdefault(record.group_id, set()).add(record.reason)
    rollouts = read_all(stack.kafka, topic_name(ns, "rollouts", "default"))
    groups = {decode(m.value(), RolloutGroup).group_id for m in rollouts}
    # every explorer stopped cleanly: its last ledger has nothing in flight and counts what it published
    assert len(ledgers) == explorers and not any(lg.in_flight for lg in ledgers.values())
    assert sum(lg.produced for lg in ledgers.values()) == len(groups)
    # a dropped group is one the explorers made, filtered by stream ops or too stale for the trainer
    scored = {decode(m.value(), ExperienceGroup).group_id for m in read_all(stack.kafka, topic_name(ns, "experiences"))}
    assert set(dropped) <= groups
    for group_id, reasons in dropped.items():
        assert reasons in ({"filtered"}, {"stale"}), (group_id, reasons)
        assert (group_id in scored) == (reasons == {"stale"})
    # AReaL's bound at the final version, plus what explorers deciding within the moment it takes to
    # see each other's reservation may start together (one batch each at most)
    bound = ((steps + tc.max_staleness + 1) * tc.batch_groups * tc.sync_interval + len(dropped)
             + explorers * cfg.explorer.tasks_per_batch)
    assert len(groups) <= bound, (len(groups), len(dropped), bound)
