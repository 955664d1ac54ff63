"""The trainer on DeepSpeed ZeRO-2 and ZeRO-3 with two data-parallel ranks (gloo on CPU, launched
by `streamrft train` under torchrun) on the embedded stack: through a real `streamrft run`, and
killed -9 and resumed on groups of uneven sizes."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from streamrft.infra.objectstore import WeightStore
from tests_helpers import demo_overrides, kill_tree, process_tree, read_all, trainer_version

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("ranks,stage,device", [(2, 2, "cpu"), (2, 3, "cpu"),
                                                 pytest.param(1, 2, "cuda", marks=pytest.mark.gpu),
                                                 pytest.param(1, 3, "cuda", marks=pytest.mark.gpu)])
def test_deepspeed_ranks_train_and_publish(stack, tmp_path, ranks, stage, device):
    """Two gloo ranks on the CPU; on a GPU one NCCL rank, with the explorer sampling there too."""
    extra = ["trainer.max_steps=2", "explorer.num_explorers=1", "eval.every_versions=0", "trainer.engine=deepspeed",
             f"trainer.deepspeed.num_gpus={ranks}", f"trainer.deepspeed.zero_stage={stage}",
             f"namespace=ds{stage}{device}", f"explorer.engine.device={device}"]
    res = subprocess.run([sys.executable, "-m", "streamrft.cli", "run", str(ROOT / "examples" / "cpu_demo.yaml"),
                          *demo_overrides(stack, tmp_path, extra)], capture_output=True, text=True, timeout=900, cwd=ROOT)
    run_dir = next(p for p in tmp_path.iterdir() if (p / "config.yaml").exists())
    log_file = run_dir / "logs" / "trainer.log"
    log = log_file.read_text() if log_file.exists() else ""  # none when the run failed before its roles
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:] + log[-3000:]
    assert log.count("trainer done: {'version': 2") == ranks  # every rank finished in step
    assert log.count(f"policy on {device}") == ranks
    store = WeightStore(stack.s3)
    ns = run_dir.name
    model = f"{ns}/policy"
    # every published version is complete and finite; training moved the weights
    fetched = {}
    for v in (0, 2):
        dest = tmp_path / f"fetch-{ns}-v{v}"
        store.fetch_version(model, v, dest)
        fetched[v] = {k: t for f in dest.glob("*.safetensors") for k, t in load_file(str(f)).items()}
    assert fetched[0].keys() == fetched[2].keys()
    assert all(torch.isfinite(t).all() for t in fetched[2].values())
    assert any(not torch.equal(fetched[0][k], fetched[2][k]) for k in fetched[0])


GROUP_SIZES = [1, 3] * 6  # one group a step: 1 row (rank 1 has none) or 3 (2 + 1); steps take ~0.1 s


def _trainer_tree(p: subprocess.Popen) -> list[int]:
    """The CLI, torchrun and both ranks, once all are up (the ranks run in sessions of their own)."""
    tree = process_tree(p.pid)
    return tree if len(tree) >= 4 else []


@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_trainer_killed_with_sigkill_resumes_and_trains_nothing_twice(stack, namespace, trainer_config,
                                                                               kit, tmp_path, stage):
    """Two gloo ranks, one group a step of 1 or 3 trajectories, killed -9 (the `streamrft train` CLI,
    torchrun and both ranks, by PID) once it has published versions, then started again: it resumes
    from its newest complete checkpoint, announces versions strictly increasing, trains every
    trajectory exactly once over the restart, and leaves nothing running. The learning rate warms up
    over all the steps (`trainer.warmup_steps`): the resumed ranks go on with the ramp where the
    checkpoint left it (DeepSpeed's scheduler state), not from its start."""
    from streamrft.config import dump_config
    from streamrft.infra.stack import pid_alive
    from streamrft.schemas import Metric, WeightVersion, decode, topic_name

    steps = len(GROUP_SIZES)
    cfg = trainer_config(stack, "trainer.engine=deepspeed", "trainer.deepspeed.num_gpus=2",
                         f"trainer.deepspeed.zero_stage={stage}", "trainer.batch_groups=1",
                         f"trainer.max_steps={steps}", f"trainer.max_staleness={steps}", f"trainer.warmup_steps={steps}")
    groups = [kit.group(f"G{i}", 0, n=n) for i, n in enumerate(GROUP_SIZES)]
    kit.produce(stack.kafka, namespace, groups)
    resolved = tmp_path / "config.yaml"
    resolved.write_text(dump_config(cfg))
    ckpt = Path(cfg.output_dir) / "trainer"

    def spawn(log: Path) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "streamrft.cli", "train", str(resolved)], stdout=open(log, "wb"),
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=ROOT, start_new_session=True)

    started: set[int] = set()
    p = spawn(tmp_path / "train1.log")
    try:
        deadline = time.monotonic() + 150
        while trainer_version(ckpt) < 3 or not (tree := _trainer_tree(p)):
            assert time.monotonic() < deadline and p.poll() is None, (tmp_path / "train1.log").read_text()[-3000:]
            time.sleep(0.1)
        started.update(tree)
        kill_tree(tree)  # CLI, torchrun, rank 0, rank 1: SIGKILL each
        p.wait()
        killed_at = trainer_version(ckpt)
        assert 3 <= killed_at < steps
        deadline = time.monotonic() + 10
        while any(pid_alive(pid) for pid in tree):
            assert time.monotonic() < deadline, f"still running after kill -9: {[q for q in tree if pid_alive(q)]}"
            time.sleep(0.1)

        p = spawn(tmp_path / "train2.log")
        deadline = time.monotonic() + 150
        while p.poll() is None:  # note every process of the second run, to check they all end
            assert time.monotonic() < deadline, (tmp_path / "train2.log").read_text()[-3000:]
            started.update(process_tree(p.pid))
            time.sleep(0.2)
        log2 = (tmp_path / "train2.log").read_text()
        assert p.returncode == 0, log2[-3000:]
    finally:
        if p.poll() is None:  # a failed check: stop what runs now
            kill_tree(process_tree(p.pid))
            p.wait()
    assert len(started) >= 8  # two runs of the CLI, torchrun and two ranks
    assert not [pid for pid in started if pid_alive(pid)]  # nothing left running

    assert log2.count(f"at version {killed_at}") == 2  # both ranks resumed from the newest checkpoint
    assert log2.count(f"trainer done: {{'version': {steps}") == 2
    state = json.loads((ckpt / f"v{steps}" / "state.json").read_text())
    assert (state["version"], state["step"]) == (steps, steps)
    announced = [decode(m.value(), WeightVersion).version for m in read_all(stack.kafka, topic_name(namespace, "weights"))]
    assert announced == sorted(set(announced)) and announced[-1] == steps, announced  # strictly increasing
    assert WeightStore(stack.s3).list_versions(cfg.weights_key)[-1] == steps
    audit = kit.audit(ckpt)
    assert sorted(audit) == sorted(t.traj_id for g in groups for t in g.trajectories), audit
    assert max(audit.values()) == 1, "a trajectory was trained twice"
    assert state["counts"]["trained"] == sum(GROUP_SIZES)
    # step s is update s - 1: lr * s / warmup_steps, in both runs (a step redone after the restart
    # reports it again), so the resumed steps continue the ramp
    metrics = [decode(r.value(), Metric) for r in read_all(stack.kafka, topic_name(namespace, "metrics"))]
    lrs = [(m.step, m.values["lr"]) for m in metrics if m.role == "trainer" and "lr" in m.values]
    assert {s for s, _ in lrs} == set(range(1, steps + 1)), lrs
    assert all(lr == pytest.approx(cfg.trainer.lr * s / steps) for s, lr in lrs), lrs
