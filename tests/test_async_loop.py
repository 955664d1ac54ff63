"""The whole asynchronous loop on the real embedded stack: explorers -> faust stream ops ->
trainer -> S3 weight versions -> explorers, with a tiny locally built model.

1. `streamrft run` for a few steps: versions advance, explorers swap weights, and every
   trajectory produced is accounted for (trained, stale, duplicate, filtered, dead-lettered, or
   still queued behind a committed offset).
2. A trainer killed with -9 mid-run and restarted resumes at its checkpointed version and trains
   no experience twice (its audit trail is checked against the experiences topic).
3. The same loop with LoRA: versions are adapters, explorers merge them, checkpoints hold adapters.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from streamrft.config import load_config
from streamrft.infra.kafka import committed_offsets
from streamrft.schemas import ExperienceGroup, RolloutGroup, decode, topic_name
from tests_helpers import demo_overrides, read_all as _read_all, read_tensorboard, stop_all, trainer_version

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "examples" / "cpu_demo.yaml"

pytestmark = pytest.mark.slow


def _committed(stack, group: str, topic: str) -> dict[int, int]:
    # only this topic: status.collect would read every topic on the shared stack to its end
    return committed_offsets(stack.kafka, group, topic, list(range(stack.kafka.partitions)))


def test_short_run_versions_advance_and_every_trajectory_is_accounted_for(stack, tmp_path):
    steps = 4
    res = subprocess.run([sys.executable, "-m", "streamrft.cli", "run", str(DEMO),
                          *demo_overrides(stack, tmp_path, [f"trainer.max_steps={steps}"])],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    final = [l for l in res.stdout.splitlines() if l.startswith("final:")]
    assert len(final) == 1, res.stdout
    fields = dict(kv.split("=") for kv in final[0].removeprefix("final: ").split())
    assert int(fields["versions"]) == steps
    run_dir = next(p for p in tmp_path.iterdir() if (p / "config.yaml").exists())
    assert (run_dir / "reward_curve.png").stat().st_size > 0
    cfg = load_config(run_dir / "config.yaml")
    ns = cfg.namespace

    # one logger, the launcher's, logged the stages and every role off the metrics topic (the roles,
    # started with monitor.backends=[], wrote no event file of their own)
    assert len(list((run_dir / "tensorboard").glob("events.out.tfevents.*"))) == 1
    logged = read_tensorboard(run_dir / "tensorboard")
    assert [s for s, _ in logged["stage/0/loss"]] == list(range(1, 21))  # demo_overrides' 20-step SFT stage
    assert [s for s, _ in logged["trainer/reward_mean"]] == list(range(1, steps + 1))
    assert "explorer/0/trajectories" in logged and "stream_ops/scored" in logged
    evals = logged["eval/eval_reward"]  # the launcher's start and end evals around the explorers' own
    assert evals[0] == (0, pytest.approx(float(fields["eval_reward_start"]), abs=1e-3))
    assert evals[-1] == (steps, pytest.approx(float(fields["eval_reward_end"]), abs=1e-3))

    # explorers hot-swapped to newer versions
    swaps = [int(m) for f in (run_dir / "logs").glob("explorer-*.log")
             for m in re.findall(r"'swaps': (\d+)", f.read_text())]
    assert swaps and max(swaps) >= 1

    # stream ops: every group below the committed offsets came out as an experience, was filtered
    # (all rewards equal), or was dead-lettered
    rollouts = _read_all(stack.kafka, topic_name(ns, "rollouts", "default"))
    produced = {}
    for m in rollouts:
        g = decode(m.value(), RolloutGroup)
        produced[(m.partition(), m.offset())] = g
    assert sum(len(g.trajectories) for g in produced.values()) >= steps * 4 * 4
    experiences = [decode(m.value(), ExperienceGroup) for m in _read_all(stack.kafka, topic_name(ns, "experiences"))]
    scored = {e.group_id for e in experiences}
    dead = _read_all(stack.kafka, topic_name(ns, "dlq"))
    committed = _committed(stack, f"{ns}.stream-ops", topic_name(ns, "rollouts", "default"))
    processed = [g for (p, o), g in produced.items() if o < committed.get(p, 0)]
    assert processed, "stream ops committed nothing"
    from streamrft.stream_ops.rewards.reverse import reverse_reward
    for g in processed:
        if g.group_id in scored:
            continue
        rewards = {reverse_reward(t.response_text, g.task.answer) for t in g.trajectories}
        assert len(rewards) == 1, f"group {g.group_id} neither scored nor zero-variance"
    assert not dead  # the explorers produced nothing malformed

    # trainer: trained + stale + duplicate == trajectories below its committed offsets
    state = json.loads((run_dir / "trainer" / f"v{trainer_version(run_dir / 'trainer')}" / "state.json").read_text())
    counts = state["counts"]
    exp_records = _read_all(stack.kafka, topic_name(ns, "experiences"))
    consumed = [decode(m.value(), ExperienceGroup) for m in exp_records
                if m.offset() < state["offsets"].get(f"{m.topic()}:{m.partition()}", 0)]
    assert counts["trained"] + counts["stale"] + counts["duplicate"] == sum(len(e.trajectories) for e in consumed)
    assert counts["trained"] > 0
    audit = [i for f in (run_dir / "trainer" / "audit").glob("v*.json") for i in json.loads(f.read_text())]
    assert len(audit) == len(set(audit)) == counts["trained"]


def _spawn(args: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "streamrft.cli", *args], stdout=open(log, "ab"),
                            stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)


def test_trainer_killed_with_sigkill_resumes_and_trains_nothing_twice(stack, tmp_path):
    from streamrft.config import dump_config
    from streamrft.launch.prepare import prepare

    cfg = load_config(DEMO, demo_overrides(stack, tmp_path, ["trainer.max_steps=6", f"namespace=kill-{os.getpid()}-{int(time.time())}"]))
    cfg = prepare(cfg)
    resolved = tmp_path / "config.yaml"
    resolved.write_text(dump_config(cfg))
    ckpt = tmp_path / "trainer"
    procs = {"score": _spawn(["score", str(resolved)], tmp_path / "score.log"),
             "explore": _spawn(["explore", str(resolved), "--index", "0"], tmp_path / "explore.log"),
             "train": _spawn(["train", str(resolved)], tmp_path / "train1.log")}
    try:
        deadline = time.monotonic() + 300
        while trainer_version(ckpt) < 2:
            assert time.monotonic() < deadline, (tmp_path / "train1.log").read_text()[-3000:]
            assert procs["train"].poll() is None, (tmp_path / "train1.log").read_text()[-3000:]
            time.sleep(0.2)
        os.kill(procs["train"].pid, signal.SIGKILL)
        procs["train"].wait()
        killed_at = trainer_version(ckpt)
        procs["train"] = _spawn(["train", str(resolved)], tmp_path / "train2.log")
        assert procs["train"].wait(timeout=400) == 0, (tmp_path / "train2.log").read_text()[-3000:]
    finally:
        stop_all(procs)
    log2 = (tmp_path / "train2.log").read_text()
    assert f"at version {killed_at}" in log2  # resumed from the checkpoint, not from scratch
    state = json.loads((ckpt / "v6" / "state.json").read_text())
    assert state["version"] == 6 and state["step"] == 6
    audit = Counter(i for f in (ckpt / "audit").glob("v*.json") for i in json.loads(f.read_text()))
    assert audit and max(audit.values()) == 1, "a trajectory was trained twice"
    assert sum(audit.values()) == state["counts"]["trained"]
    # every audited id is a real trajectory from the experiences topic
    ids = {t.traj_id for m in _read_all(stack.kafka, topic_name(cfg.namespace, "experiences"))
           for t in decode(m.value(), ExperienceGroup).trajectories}
    assert set(audit) <= ids


def test_lora_run_publishes_adapters_that_explorers_load(stack, tmp_path):
    import math

    from streamrft.config import LoraSpec
    from streamrft.infra.objectstore import WeightStore

    steps = 3
    res = subprocess.run([sys.executable, "-m", "streamrft.cli", "run", str(DEMO),
                          *demo_overrides(stack, tmp_path, [f"trainer.max_steps={steps}", "model.lora={r: 4, alpha: 8}",
                                                            "trainer.lr=0.003", "eval.every_versions=0"])],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    final = next(l for l in res.stdout.splitlines() if l.startswith("final:"))
    fields = dict(kv.split("=") for kv in final.removeprefix("final: ").split())
    assert int(fields["versions"]) == steps and math.isfinite(float(fields["eval_reward_end"]))
    run_dir = next(p for p in tmp_path.iterdir() if (p / "config.yaml").exists())
    cfg = load_config(run_dir / "config.yaml")

    store = WeightStore(stack.s3)
    kept = store.list_versions(cfg.weights_key)
    assert kept[-1] == steps
    for v in kept:  # every version an adapter, said so in its manifest, a fraction of the model's size
        manifest = store.read_manifest(cfg.weights_key, v)
        assert LoraSpec.from_manifest(manifest.meta) == cfg.model.lora
        adapter_bytes = sum(f["size"] for f in manifest.files.values())
        model_bytes = (Path(cfg.model.path) / "model.safetensors").stat().st_size
        assert adapter_bytes < model_bytes / 2, (adapter_bytes, model_bytes)
    ckpt = run_dir / "trainer" / f"v{steps}"
    assert {p.name for p in ckpt.iterdir()} >= {"adapter.safetensors", "optimizer.pt"}
    assert not list(ckpt.glob("model*.safetensors"))

    swaps = [int(m) for f in (run_dir / "logs").glob("explorer-*.log")
             for m in re.findall(r"'swaps': (\d+)", f.read_text())]
    assert swaps and max(swaps) >= 1  # explorers loaded (merged) LoRA versions
    losses = [float(m) for m in re.findall(r"step \d+ v\d+ loss (\S+)", (run_dir / "logs" / "trainer.log").read_text())]
    assert len(losses) == steps and all(math.isfinite(x) for x in losses)


def test_synchronous_on_policy_mode_is_the_same_machinery(stack, tmp_path):
    """max_staleness 0: every trained sample was generated by the trainer's current weights, and
    admission control does not deadlock when zero-variance groups are filtered."""
    res = subprocess.run([sys.executable, "-m", "streamrft.cli", "run", str(DEMO),
                          *demo_overrides(stack, tmp_path, ["trainer.max_steps=3", "trainer.max_staleness=0"])],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    run_dir = next(p for p in tmp_path.iterdir() if (p / "config.yaml").exists())
    cfg = load_config(run_dir / "config.yaml")
    audit = {v: json.loads((run_dir / "trainer" / "audit" / f"v{v}.json").read_text()) for v in (1, 2, 3)}
    versions = {t.traj_id: t.model_version for m in _read_all(stack.kafka, topic_name(cfg.namespace, "experiences"))
                for t in decode(m.value(), ExperienceGroup).trajectories}
    for v, ids in audit.items():  # the step that produced version v trained on version v-1's samples only
        assert ids and {versions[i] for i in ids} == {v - 1}


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "kill"])
def test_ctrl_c_stops_every_role_and_the_stack_it_started(tmp_path, signum):
    from streamrft.infra.stack import free_ports, pid_alive

    ports = free_ports()
    args = [f"stack.data_dir={tmp_path / 'stack'}", f"stack.kafka_port={ports['kafka_port']}",
            f"stack.s3_port={ports['s3_port']}", f"stack.weed_port_base={ports['weed_port_base']}",
            f"output_dir={tmp_path / 'out'}", f"model.path={tmp_path / 'base'}",
            "model.build={hidden_size: 32, layers: 1, heads: 2, seed: 0}", "stages=[]",
            "data.synthetic={task: reverse, train_size: 100, eval_size: 10, seed: 0}", "eval.max_tasks=10"]
    proc = subprocess.Popen([sys.executable, "-m", "streamrft.cli", "run", str(DEMO), *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:  # wait until the roles run and the first progress line is out
        lines.append(line)
        if line.startswith("[") and "step" in line:
            break
    roles = json.loads(next((tmp_path / "out").glob("*/roles.json")).read_text())
    stack = json.loads((tmp_path / "stack" / "stack.json").read_text())
    proc.send_signal(signum)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, "".join(lines) + out
    assert "interrupted" in out and "stack down" in out
    pids = list(roles.values()) + [p["pid"] for p in stack["procs"].values()]
    assert len(pids) == 5 + 3  # trainer, stream ops, 2 explorers, evaluator; weed, tansu, the log keeper
    assert "evaluator" in roles
    deadline = time.monotonic() + 10
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(pid_alive(p) for p in pids)


def test_run_restarts_a_role_that_dies_and_still_finishes(stack, tmp_path):
    """`streamrft run` supervises its roles: a stream-ops worker and an explorer killed with -9
    are started again (as compose's restart: on-failure would) and the run completes."""
    steps = 8
    proc = subprocess.Popen([sys.executable, "-m", "streamrft.cli", "run", str(DEMO),
                             *demo_overrides(stack, tmp_path, [f"trainer.max_steps={steps}", "eval.every_versions=0"])],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        for line in proc.stdout:  # the roles run once the first progress line is out
            lines.append(line)
            if line.startswith("[") and "step" in line:
                break
        roles = json.loads(next(tmp_path.glob("*/roles.json")).read_text())
        for name in ("stream-ops", "explorer-1"):
            os.kill(roles[name], signal.SIGKILL)
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = "".join(lines) + out
    assert proc.returncode == 0, out[-4000:]
    assert "stream-ops exited with -9: restart 1 of" in out and "explorer-1 exited with -9: restart 1 of" in out
    final = next(line for line in out.splitlines() if line.startswith("final:"))
    assert f"versions={steps}" in final
