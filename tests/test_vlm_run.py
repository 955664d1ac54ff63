"""A vision-language model through `streamrft run` on the real embedded stack: `examples/vlm_cpu.yaml`
(the tiny LLaVA built here, the synthetic picture tasks, a warm-up SFT stage on image-answer pairs),
shortened to a few versions.

Every picture is stored once in S3 by its sha256 and travels by reference: each trajectory the
explorers produced names its task's images, the very bytes the task file pointed at; stream ops
scored the groups without a dead letter; the trainer recomputed log-probs with the images' pixels
and published versions; the launcher's evals saw the pictures (a text model could not answer).
"""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from streamrft.config import load_config
from streamrft.schemas import RolloutGroup, decode, topic_name
from tests_helpers import read_all, stack_overrides

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "vlm_cpu.yaml"

pytestmark = pytest.mark.slow


def test_a_short_vlm_run_carries_every_picture_by_reference_and_trains(stack, tmp_path):
    from streamrft.infra.media import MediaStore

    steps = 3
    res = subprocess.run(
        [sys.executable, "-m", "streamrft.cli", "run", str(EXAMPLE), *stack_overrides(stack, tmp_path),
         "model.build={hidden_size: 32, layers: 1, heads: 2, seed: 0, vision: {hidden_size: 32, layers: 1, heads: 2}}",
         "data.synthetic={task: images, train_size: 120, eval_size: 12, seed: 0}",
         "stages=[{type: sft, steps: 10, batch_size: 16, lr: 0.0005, data: {size: 200, seed: 1}}]",
         "explorer.group_size=4", "explorer.tasks_per_batch=4", "trainer.batch_groups=4", "trainer.max_staleness=1",
         "stream_ops.drop_zero_variance=false", f"trainer.max_steps={steps}", "eval.every_versions=2", "eval.max_tasks=12"],
        capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    final = [l for l in res.stdout.splitlines() if l.startswith("final:")]
    assert len(final) == 1, res.stdout
    fields = dict(kv.split("=") for kv in final[0].removeprefix("final: ").split())
    assert int(fields["versions"]) == steps
    assert 0.0 <= float(fields["eval_reward_start"]) <= 1.0 and 0.0 <= float(fields["eval_reward_end"]) <= 1.0
    run_dir = next(p for p in tmp_path.iterdir() if (p / "config.yaml").exists())
    cfg = load_config(run_dir / "config.yaml")

    # the task file's pictures, by the sha256 of their bytes
    train = [json.loads(line) for line in open(cfg.data.train)]
    files = {hashlib.sha256((Path(cfg.data.train).parent / r["image"]).read_bytes()).hexdigest(): r for r in train}

    # the explorers' trajectories each show their task's one picture: its reference, those bytes
    groups = [decode(m.value(), RolloutGroup) for m in read_all(stack.kafka, topic_name(cfg.namespace, "rollouts", "default"))]
    assert groups
    media = MediaStore(cfg.s3, cfg.namespace, tmp_path / "check-cache")
    for g in groups[:8]:
        (ref,) = g.task.images
        assert ref.sha256 in files and files[ref.sha256]["prompt"] == g.task.prompt
        assert ref.uri.endswith(f"{cfg.namespace}/media/{ref.sha256}.png")
        assert hashlib.sha256(media.get(ref)).hexdigest() == ref.sha256  # fetched from S3, not the cache
        for t in g.trajectories:
            assert t.images == [ref]
    assert not read_all(stack.kafka, topic_name(cfg.namespace, "dlq"))

    state = json.loads(next((run_dir / "trainer").glob(f"v{steps}/state.json")).read_text())
    assert state["counts"]["trained"] > 0
