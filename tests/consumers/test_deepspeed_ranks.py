"""DeepSpeed ranks stay in step when a batch has fewer rows than ranks or splits unevenly.

Two gloo ranks on CPU (torchrun) run `UpdateLoop.train_step` on ZeRO-2 and ZeRO-3 engines over
batches of 1, 3, 2 and 5 rows (`ds_ranks_worker.py`). With 1 row the second rank's share is empty:
it used to skip the update, so the ranks' collectives went out of step and both hung. Now every
rank makes every update (an empty share on a zero-weighted row) and the result is the single
process's: the same updates and grad norm at every step, the same weights after four steps; also
with two epochs of two mini-batches of decoupled PPO (which the config allows the torch engine only),
and under a learning-rate warm-up (DeepSpeed's scheduler against the torch engine's own).
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from streamrft.engine.training.deepspeed_engine import _free_port
from tests_helpers import kill_tree, process_tree

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("ds_ranks_worker.py")
HANG_S = 150  # a run takes ~25 s on two busy cores; out of step, the ranks wait on each other for ever


@pytest.mark.parametrize("stage", [2, 3])
def test_uneven_and_empty_rank_shares_train_like_one_process(tmp_path, stage):
    log = tmp_path / "ranks.log"
    with open(log, "wb") as out:
        p = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                              "--master_addr=127.0.0.1", f"--master_port={_free_port()}", str(WORKER), str(tmp_path),
                              str(stage)], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
        try:
            rc = p.wait(timeout=HANG_S)
        except subprocess.TimeoutExpired:
            kill_tree(process_tree(p.pid))
            p.wait()
            pytest.fail(f"the ranks hung (killed after {HANG_S} s): {log.read_text()[-3000:]}")
    assert rc == 0, log.read_text()[-3000:]
    result = json.loads((tmp_path / f"result-{stage}.json").read_text())
    for name, case in result.items():
        assert case["finite"] and case["moved"] > 1e-3, (name, case)
        assert case["rank_diff"] == 0.0, (name, case)  # both ranks hold the same weights
        assert all(math.isfinite(n) for n in case["grad_norms"]), (name, case)  # every rank made every update
    for name, case in result.items():  # exactly the single process's updates
        assert case["updates"] == case["ref_updates"], (name, case)
        assert case["grad_norms"] == pytest.approx(case["ref_grad_norms"], rel=1e-5), (name, case)
        assert case["ref_diff"] < 1e-3 * case["ref_moved"], (name, case)
    # two epochs of two mini-batches: 1 row has no second mini-batch (skipped on both ranks alike);
    # with 3 rows rank 1's share of a mini-batch of 1 is empty (a zero-weighted row)
    assert result["decoupled_minibatches"]["updates"] == [2, 4, 4, 4]
