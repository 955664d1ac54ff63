"""A short run of `examples/smollm2_cpu.yaml` as a user starts it (`streamrft run`), on the real
SmolLM2: the trainer publishes LoRA versions, the explorer loads them and samples with them."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from streamrft.config import LoraSpec, load_config
from streamrft.infra.objectstore import WeightStore
from streamrft.schemas import Metric, decode, topic_name
from tests_helpers import read_all

pytestmark = pytest.mark.real_model

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "smollm2_cpu.yaml"


def test_a_short_run_of_the_example_publishes_versions_the_explorer_loads(stack, smollm2_dir, tmp_path):
    # two versions, every group trained: with the example's zero-variance filter a SmolLM2 version
    # took 3-3.5 minutes on a loaded 2-core machine (its groups are mostly all-zero, so the trainer
    # waited for learnable ones) and three missed a 400 s budget in CI; what this test checks (the
    # versions, the explorer's swaps) does not depend on which groups are trained
    steps = 2
    overrides = [
        "stack.embedded=false", f"kafka.bootstrap={stack.kafka.bootstrap}", f"s3.endpoint={stack.s3.endpoint}",
        f"s3.access_key={stack.s3.access_key}", f"s3.secret_key={stack.s3.secret_key}", f"s3.bucket={stack.s3.bucket}",
        f"output_dir={tmp_path}", f"model.path={smollm2_dir}",  # the converted SmolLM2 (model.source: done)
        f"trainer.max_steps={steps}", "stream_ops.drop_zero_variance=false", "eval.every_versions=0", "eval.max_tasks=8", "max_wall_s=720",
    ]
    res = subprocess.run([sys.executable, "-m", "streamrft.cli", "run", str(EXAMPLE), *overrides],
                         capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    final = next(line for line in res.stdout.splitlines() if line.startswith("final:"))
    assert f"versions={steps}" in final, final
    run_dir = next(p for p in tmp_path.iterdir() if (p / "config.yaml").exists())
    cfg = load_config(run_dir / "config.yaml")
    assert cfg.model.path == str(smollm2_dir) and cfg.model.lora is not None and cfg.explorer.chat_template

    store = WeightStore(cfg.s3)
    assert store.latest_version(cfg.weights_key) == steps
    manifest = store.read_manifest(cfg.weights_key, steps)
    assert LoraSpec.from_manifest(manifest.meta) == cfg.model.lora  # a version is the adapter alone
    assert sum(f["size"] for f in manifest.files.values()) < 50 * 2**20  # tens of MB, not the 538 MB model

    metrics = [decode(m.value(), Metric) for m in read_all(cfg.kafka, topic_name(cfg.namespace, "metrics"))]
    explorer = [m.values for m in metrics if m.role == "explorer"]
    assert explorer and max(v.get("swaps", 0) for v in explorer) >= 1, explorer[-3:]
    assert max(v["version"] for v in explorer if "version" in v) >= 1  # it sampled with a trained version
    trainer = [m.values for m in metrics if m.role == "trainer"]
    assert len(trainer) == steps and all(v["samples"] >= 1 for v in trainer)
    roles = json.loads((run_dir / "roles.json").read_text())
    assert set(roles) == {"trainer", "stream-ops", "explorer-0"}
