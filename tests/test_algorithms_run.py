"""`streamrft run` with every online algorithm type on the CPU demo, for a few steps each, on
the real stack. Checks that versions advance and the trainer logged finite losses."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests_helpers import demo_overrides

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("algo", ["grpo", "dr_grpo", "rloo", "gspo", "cispo", "ppo", "reinforce_pp", "opd"])
def test_run_with_each_online_algorithm(stack, tmp_path, algo):
    # policy_loss.type=null: each type's own loss, not the demo's decoupled PPO
    extra = [f"algorithm.type={algo}", "algorithm.policy_loss.type=null", "trainer.max_steps=2",
             "explorer.num_explorers=1", "eval.every_versions=0"]
    if algo == "opd":  # distil from the SFT-warmed model into itself: advantages ~ 0 but the path runs
        extra.append(f"algorithm.advantage.params={{teacher_path: {tmp_path / 'base'}}}")
    if algo in ("ppo", "reinforce_pp", "opd"):
        extra.append("stream_ops.drop_zero_variance=false")
    if algo == "grpo":  # the default launch, a fresh interpreter a role, runs here (the other runs fork theirs)
        extra.append("fork_roles=false")
    res = subprocess.run([sys.executable, "-m", "streamrft.cli", "run", str(ROOT / "examples" / "cpu_demo.yaml"),
                          *demo_overrides(stack, tmp_path, extra)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "versions=2 " in res.stdout
    run_dir = next(p for p in tmp_path.iterdir() if (p / "config.yaml").exists())
    log = (run_dir / "logs" / "trainer.log").read_text()
    losses = [float(x.split()[0]) for x in log.split(" loss ")[1:]]
    assert len(losses) == 2 and all(math.isfinite(l) for l in losses), log[-2000:]
    state = json.loads((run_dir / "trainer" / "v2" / "state.json").read_text())
    assert state["counts"]["trained"] > 0
