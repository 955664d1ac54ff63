"""The CPU demo's whole loop with every model on the GPU (`gpu`: skipped without one): explorers
and the evaluator sample with the transformers engine on CUDA, the trainer steps there, weight
versions go through S3 as on the CPU, and the policy learns."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests_helpers import stack_overrides

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "examples" / "cpu_demo.yaml"

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

STEPS = 60


def test_the_demo_learns_with_explorers_evaluator_and_trainer_on_the_gpu(stack, tmp_path):
    overrides = [*stack_overrides(stack, tmp_path), "model.build={hidden_size: 128, layers: 2, heads: 4, seed: 0}",
                 "explorer.engine.device=cuda", "trainer.device=cuda", f"trainer.max_steps={STEPS}",
                 "eval.every_versions=10", "max_wall_s=null"]
    res = subprocess.run([sys.executable, "-m", "streamrft.cli", "run", str(DEMO), *overrides],
                         capture_output=True, text=True, timeout=900, cwd=ROOT)
    run_dir = next(p for p in tmp_path.iterdir() if (p / "config.yaml").exists())
    logs = {p.name: p.read_text() for p in (run_dir / "logs").glob("*.log")}
    assert res.returncode == 0, res.stdout[-3000:] + logs.get("trainer.log", "")[-3000:]
    assert "policy on cuda:0: torch engine, 1 rank(s)" in logs["trainer.log"]
    explorers = [text for name, text in logs.items() if name.startswith("explorer-")]
    assert explorers and all("rollout engine: transformers on cuda" in text for text in explorers)
    final = dict(kv.split("=") for kv in next(l for l in res.stdout.splitlines()
                                               if l.startswith("final:")).removeprefix("final: ").split())
    assert int(final["versions"]) == STEPS
    print("gpu loop:", final)
    assert float(final["eval_reward_end"]) >= float(final["eval_reward_start"]) + 0.15, final
