"""Agentic RL end to end on the real embedded stack: `streamrft run examples/agent_cpu.yaml` (the
guess-the-number environment, warm-up demonstrations, explorers -> faust stream ops -> trainer ->
S3 -> explorers) for a few steps: the `multi_turn` workflow in lockstep, and the `step_wise` one
with episodes scheduled one by one (`explorer.scheduling: per_episode`), on-policy
(`trainer.max_staleness: 0`), its finished groups published in the order they were admitted
(`explorer.publish_order: admitted`), in an environment whose every step waits a seeded delay
(`explorer.env.latency`), with an explorer killed -9 once its metrics report 64 episodes in flight. Every
trajectory is accounted for as in the single-turn loop test: each rollout group below stream ops'
committed offsets is an experience or a zero-variance group, and the trainer's trained + stale +
duplicate equals the trajectories below its committed offsets, with no id trained twice.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from streamrft.config import load_config
from streamrft.engine.algorithms.offpolicy import LENGTH_BUCKETS
from streamrft.infra.kafka import committed_offsets
from streamrft.schemas import ExperienceGroup, Metric, RolloutGroup, decode, topic_name
from tests_helpers import read_all, stack_overrides, trainer_version

ROOT = Path(__file__).resolve().parents[1]
AGENT = ROOT / "examples" / "agent_cpu.yaml"
STEPS = 4
IN_FLIGHT = 64

pytestmark = pytest.mark.slow


def _overrides(stack, out: Path, workflow: str, scheduling: str) -> list[str]:
    # 64 episodes in flight in each explorer: groups of 8, a version of 32 groups (on-policy, the
    # run's headroom is one version: 16 groups an explorer, 8 at a time), tool calls of 0.3-1.5 s
    slow = ([f"explorer.scheduling={scheduling}", f"explorer.max_concurrent_episodes={IN_FLIGHT}",
             "explorer.group_size=8", "trainer.batch_groups=32",
             "explorer.env={type: guess_number, params: {low: 1, high: 8, max_guesses: 4}, "
             "latency: {median_s: 0.3, p99_s: 1.5, seed: 0}}",
             # on-policy: every group of a version waits for it, so explorers with nothing in flight must swap
             "trainer.max_staleness=0", "explorer.publish_order=admitted", "explorer.publish_wait_s=5"]
            if scheduling == "per_episode" else [])
    return [
        *stack_overrides(stack, out),
        "stages=[{type: sft, steps: 20, batch_size: 16, lr: 0.003, data: {demos: {linear: 0.5, bisect: 0.5}, size: 100}}]",
        "data.synthetic={task: guess_number, train_size: 200, eval_size: 16, seed: 0}",
        f"explorer.workflow={workflow}", "explorer.group_size=4", "explorer.tasks_per_batch=4",
        "trainer.batch_groups=4", "trainer.max_staleness=1", f"trainer.max_steps={STEPS}",
        "eval.every_versions=2", "eval.max_tasks=16", "max_wall_s=null", *slow,
    ]


def _kill_with_episodes_in_flight(stack, out: Path, proc: subprocess.Popen, deadline_s: float = 300.0) -> str | None:
    """Once an explorer's metrics (every 5 s) report `IN_FLIGHT` episodes in flight, kill -9 that
    explorer: the role's name, or None if none did before the run ended or the deadline."""
    deadline = time.monotonic() + deadline_s
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
        roles_file = next(out.glob("*/roles.json"), None)
        if roles_file is None:
            continue
        roles = json.loads(roles_file.read_text())
        ns = load_config(roles_file.parent / "config.yaml").namespace
        for m in read_all(stack.kafka, topic_name(ns, "metrics"), deadline_s=10):
            metric = decode(m.value(), Metric)
            if metric.role == "explorer" and metric.values.get("episodes_in_flight", 0) >= IN_FLIGHT:
                name = metric.role_id.rsplit("-", 1)[0]  # explorer-<index>-<pid>
                if str(roles.get(name)) == metric.role_id.rsplit("-", 1)[1]:  # that process still runs
                    os.kill(roles[name], signal.SIGKILL)
                    return name
    return None


@pytest.mark.parametrize("workflow,scheduling", [("multi_turn", "lockstep"), ("step_wise", "per_episode")])
def test_a_short_agent_run_accounts_for_every_trajectory(stack, tmp_path, workflow, scheduling):
    from streamrft.stream_ops.scoring import build_scorer

    proc = subprocess.Popen([sys.executable, "-m", "streamrft.cli", "run", str(AGENT),
                             *_overrides(stack, tmp_path, workflow, scheduling)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    killed = None
    try:
        if scheduling == "per_episode":  # kill -9 an explorer while it has 64 episodes in flight
            killed = _kill_with_episodes_in_flight(stack, tmp_path, proc)
        proc.wait(timeout=600)
        reader.join(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    stdout = "".join(lines)
    assert proc.returncode == 0, stdout[-4000:]
    final = [l for l in stdout.splitlines() if l.startswith("final:")]
    assert len(final) == 1, stdout
    assert dict(kv.split("=") for kv in final[0].removeprefix("final: ").split())["versions"] == str(STEPS)
    if scheduling == "per_episode":  # restarted; the engine's stages: environment time is its own
        assert killed is not None, f"no explorer reported {IN_FLIGHT} episodes in flight\n" + stdout[-4000:]
        assert f"{killed} exited with -9: restart 1 of" in stdout
        assert any(l.startswith("profile:") and " env " in l for l in stdout.splitlines()), stdout
    run_dir = next(p for p in tmp_path.iterdir() if (p / "config.yaml").exists())
    cfg = load_config(run_dir / "config.yaml")
    ns, kafka = cfg.namespace, stack.kafka
    if scheduling == "per_episode":  # the explorers report what publishing in admission order held back
        explorers = [decode(m.value(), Metric).values for m in read_all(kafka, topic_name(ns, "metrics"))]
        assert any("groups_held" in v and "groups_waited_out" in v for v in explorers), "no release-order counts"
        # episodes by length, as published (explorers) and as trained (trainer): shares that sum to 1
        published = [sum(v[f"published_{k}"] for k in LENGTH_BUCKETS) for v in explorers if "published_turns_1" in v]
        trained = [sum(v[k] for k in LENGTH_BUCKETS) for v in explorers if "turns_1" in v]
        assert published and trained, "no length mix reported"
        assert any(abs(x - 1) < 1e-6 for x in published) and all(abs(x - 1) < 1e-6 for x in trained)

    # what the explorers produced is the workflow's shape
    rollouts_topic = topic_name(ns, "rollouts", cfg.explorer.team)
    produced = {(m.partition(), m.offset()): decode(m.value(), RolloutGroup) for m in read_all(kafka, rollouts_topic)}
    trajectories = [t for g in produced.values() for t in g.trajectories]
    assert len(produced) >= STEPS * 4
    # nothing published twice, nor half: every group once, whole (a group is one record)
    assert len({g.group_id for g in produced.values()}) == len(produced)
    assert len({t.traj_id for t in trajectories}) == len(trajectories)
    if workflow == "multi_turn":
        assert all(len(g.trajectories) == 4 for g in produced.values())
        assert any(0 in t.mask() for t in trajectories), "no environment tokens masked"
        assert all(t.finish_reason in ("env_done", "max_turns", "length", "max_total_tokens") for t in trajectories)
    else:  # every group: 4 episodes, each with all its steps 0..num_steps-1, every step token trained
        for g in produced.values():
            steps: dict[str, list[int]] = {}
            for t in g.trajectories:
                steps.setdefault(t.info["episode_id"], []).append(t.info["step"])
            assert len(steps) == cfg.explorer.group_size
            assert all(s == list(range(len(s))) for s in steps.values())
            assert all(t.info["num_steps"] == len(steps[t.info["episode_id"]]) for t in g.trajectories)
        assert all(all(m == 1 for m in t.mask()) for t in trajectories)

    # stream ops: every group below the committed offsets is an experience or a zero-variance group
    experiences = [decode(m.value(), ExperienceGroup) for m in read_all(kafka, topic_name(ns, "experiences"))]
    scored = {e.group_id for e in experiences}
    committed = committed_offsets(kafka, f"{ns}.stream-ops", rollouts_topic, list(range(kafka.partitions)))
    processed = [g for (p, o), g in produced.items() if o < committed.get(p, 0)]
    assert processed, "stream ops committed nothing"
    scorer = build_scorer(cfg)
    assert all(g.group_id in scored or scorer(g) is None for g in processed)
    assert not read_all(kafka, topic_name(ns, "dlq")), "the explorers produced something stream ops refused"
    if workflow == "step_wise":  # every step of an episode has the episode's advantage
        for e in experiences:
            by_episode: dict[str, set] = {}
            for t, a in zip(e.trajectories, e.advantages):
                by_episode.setdefault(t.info["episode_id"], set()).add(round(a, 6))
            assert all(len(a) == 1 for a in by_episode.values()), f"steps of one episode differ: {by_episode}"

    # trainer: trained + stale + duplicate == trajectories below its committed offsets, none twice
    state = json.loads((run_dir / "trainer" / f"v{trainer_version(run_dir / 'trainer')}" / "state.json").read_text())
    counts = state["counts"]
    consumed = [decode(m.value(), ExperienceGroup) for m in read_all(kafka, topic_name(ns, "experiences"))
                if m.offset() < state["offsets"].get(f"{m.topic()}:{m.partition()}", 0)]
    assert counts["trained"] + counts["stale"] + counts["duplicate"] == sum(len(e.trajectories) for e in consumed)
    assert counts["trained"] > 0
    audit = [i for f in (run_dir / "trainer" / "audit").glob("v*.json") for i in json.loads(f.read_text())]
    assert len(audit) == len(set(audit)) == counts["trained"]
