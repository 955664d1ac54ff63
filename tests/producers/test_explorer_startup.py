"""An explorer's start on the real broker: it joins the members' group while its engine loads (the
join's rebalance overlaps the load instead of following it), and an engine that fails to load
makes it leave the group at once, not after the session timeout."""
from __future__ import annotations

import time

import pytest

from streamrft.config import load_config
from streamrft.producers.membership import Membership
from tests_helpers import demo_overrides, wait_for

pytest.importorskip("torch")


def _config(stack, tmp_path, namespace):
    from streamrft.launch.prepare import prepare

    return prepare(load_config("examples/cpu_demo.yaml", demo_overrides(stack, tmp_path, [
        f"namespace={namespace}", "eval.every_versions=0", "explorer.num_explorers=1"])))


def test_the_explorer_holds_its_slots_while_its_engine_loads(stack, tmp_path, namespace, monkeypatch):
    import streamrft.engine.rollout as rollout
    from streamrft.producers.explorer import Explorer

    cfg = _config(stack, tmp_path, namespace)
    real = rollout.engine_from_config
    joined: list[Membership] = []  # the explorer's membership, once started
    seen: dict = {}

    def slow_load(c):  # the engine's load, held until the explorer's slots came
        seen["slots_during_load"] = len(wait_for(lambda: joined and joined[0].slots, 60, "slots while the engine loads"))
        return real(c)

    original_start = Membership.start

    def start(self):
        joined.append(self)
        return original_start(self)

    monkeypatch.setattr(rollout, "engine_from_config", slow_load)
    monkeypatch.setattr(Membership, "start", start)
    explorer = Explorer(cfg, 0)
    try:
        assert seen["slots_during_load"] == explorer.members.num_slots  # alone: every slot
        assert explorer.engine.version == 0
    finally:
        explorer.members.stop()
        explorer.admission.stop()


def test_an_explorer_whose_engine_fails_to_load_leaves_the_group_at_once(stack, tmp_path, namespace, monkeypatch):
    import streamrft.engine.rollout as rollout
    from streamrft.producers.explorer import Explorer

    cfg = _config(stack, tmp_path, namespace)
    other = Membership(cfg.kafka, namespace, "other").start()
    try:
        wait_for(lambda: len(other.slots) == other.num_slots, 30, "the other member alone")

        def failing_load(c):
            wait_for(lambda: len(other.slots) < other.num_slots, 60, "the explorer joined")
            raise OSError("no model here")

        monkeypatch.setattr(rollout, "engine_from_config", failing_load)
        with pytest.raises(OSError, match="no model here"):
            Explorer(cfg, 0)
        t0 = time.monotonic()
        wait_for(lambda: len(other.slots) == other.num_slots, 30, "the failed explorer's slots back")
        # it left the group: well within the session timeout its expiry would have taken
        assert time.monotonic() - t0 < cfg.kafka.session_timeout_ms / 1000
    finally:
        other.stop()


def test_an_explorer_refuses_a_task_file_its_rewards_cannot_score(stack, tmp_path, namespace):
    """A code task whose test cannot be split into a call and an expected value stops the explorer
    when it loads its tasks, naming the task: never a run that dead-letters every group later."""
    import json

    from streamrft.config.stream_ops import RewardTerm
    from streamrft.producers.explorer import Explorer

    cfg = _config(stack, tmp_path, namespace)
    tasks = tmp_path / "code_tasks.jsonl"
    tasks.write_text("\n".join(json.dumps(row) for row in [
        {"prompt": "write add", "answer": "assert add(1, 2) == 3"},
        {"prompt": "write add", "answer": "assert add(1, 2) > 2"}]) + "\n")
    cfg.data.train = str(tasks)
    cfg.stream_ops.rewards = [RewardTerm(name="code_tests")]
    explorer = Explorer(cfg, 0)
    try:
        with pytest.raises(ValueError, match=r"task code_tasks-1: reward code_tests: test 0 .*comparison `Gt`"):
            explorer.run()
    finally:
        explorer.members.stop()
        explorer.admission.stop()
