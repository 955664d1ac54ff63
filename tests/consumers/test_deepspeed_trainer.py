"""The trainer on DeepSpeed ZeRO-2 and ZeRO-3 with two data-parallel ranks (gloo on CPU, launched
by `streamrft train` under torchrun), through a real `streamrft run` on the embedded stack."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from streamrft.infra.objectstore import WeightStore
from tests_helpers import demo_overrides

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_two_ranks_train_and_publish(stack, tmp_path, stage):
    extra = ["trainer.max_steps=2", "explorer.num_explorers=1", "eval.every_versions=0", "trainer.engine=deepspeed",
             "trainer.deepspeed.num_gpus=2", f"trainer.deepspeed.zero_stage={stage}", f"namespace=ds{stage}"]
    res = subprocess.run([sys.executable, "-m", "streamrft.cli", "run", str(ROOT / "examples" / "cpu_demo.yaml"),
                          *demo_overrides(stack, tmp_path, extra)], capture_output=True, text=True, timeout=900, cwd=ROOT)
    run_dir = next(p for p in tmp_path.iterdir() if (p / "config.yaml").exists())
    log = (run_dir / "logs" / "trainer.log").read_text()
    assert res.returncode == 0, res.stdout[-2000:] + log[-3000:]
    assert log.count("trainer done: {'version': 2") == 2  # both ranks finished in step
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
