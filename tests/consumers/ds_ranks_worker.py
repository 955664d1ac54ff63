"""Run under `torch.distributed.run --nproc_per_node=2` by test_deepspeed_ranks.py (not a test module).

`python -m torch.distributed.run --nproc_per_node=2 tests/consumers/ds_ranks_worker.py OUT STAGE`

Every rank builds the same tiny model and the same batches, then `UpdateLoop.train_step` runs on a
DeepSpeed ZeRO-`STAGE` engine for batches of fewer rows than ranks (1), uneven splits (3, 5) and an
even one (2). Each case also runs, on every rank, a single-process reference: the torch engine on a
copy of the same model fed the whole batches. Rank 0 writes `OUT/result-<stage>.json`: per case the
grad norm of every step and the number of updates of both, the largest difference between the two
ranks' weights after the steps, and between the DeepSpeed weights and the reference's.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # this checkout's streamrft (not an installed one), tests_helpers

import torch  # noqa: E402

from tests_helpers import random_samples, update_loop  # noqa: E402

DEMO = ROOT / "examples" / "cpu_demo.yaml"
SIZES = [1, 3, 2, 5]  # rows per batch: fewer than ranks, uneven, even, uneven again

CASES = {
    # the default objective (token-mean), with a KL loss to a reference model and an entropy bonus
    "grpo_kl_entropy": ["algorithm.type=grpo", "algorithm.kl.coef=0.05", "algorithm.entropy_coef=0.01"],
    # sequence counts instead of token counts (Dr.GRPO's constant normaliser), under a learning-rate
    # warm-up (DeepSpeed steps its scheduler; the reference, the torch engine, sets each update's lr)
    "dr_grpo": ["algorithm.type=dr_grpo", "trainer.warmup_steps=3"],
    # several updates per batch: mini-batches (a rank's share of one is often empty), decoupled PPO's
    # proximal log-probs. The config refuses ppo_epochs / mini_batches with DeepSpeed (one update per
    # batch); UpdateLoop keeps the ranks in step and equal to one process anyway
    "decoupled_minibatches": ["algorithm.policy_loss.type=decoupled_ppo"],
}
UPDATES = {"decoupled_minibatches": {"ppo_epochs": 2, "mini_batches": 2}}  # set past the config's check


def flat(model, stage: int) -> torch.Tensor:
    import deepspeed

    params = list(model.parameters())
    if stage == 3:  # partitioned: gather the full weights (a collective)
        with deepspeed.zero.GatheredParameters(params):
            return torch.cat([p.detach().flatten().clone() for p in params])
    return torch.cat([p.detach().flatten().clone() for p in params])


def run_case(name: str, overrides: list[str], stage: int, out: Path, rank: int, world: int) -> dict:
    import torch.distributed as dist

    from streamrft.config import load_config
    from streamrft.engine.models import build_char_tokenizer, build_tiny_model
    from streamrft.engine.training.deepspeed_engine import DeepSpeedTrainEngine
    from streamrft.engine.training.torch_engine import TorchTrainEngine

    common = [f"model.path={out}/unused", "trainer.lr=0.01", "trainer.grad_clip=1.0", "trainer.seed=3",
              "trainer.engine=deepspeed", "trainer.deepspeed.num_gpus=2", f"trainer.deepspeed.zero_stage={stage}"]
    cfg = load_config(DEMO, [*common, *overrides])
    ref_cfg = load_config(DEMO, [*common, *overrides, "trainer.engine=torch"])
    for key, value in UPDATES.get(name, {}).items():
        setattr(cfg.trainer, key, value)
        setattr(ref_cfg.trainer, key, value)
    tok = build_char_tokenizer("abcdefghijklmnopqrstuvwxyz=")

    def model():
        return build_tiny_model(out / f"model-{stage}-{name}-rank{rank}", tok, hidden_size=32, layers=1, heads=2,
                                seed=0).train()

    ds = update_loop(cfg, DeepSpeedTrainEngine(model(), cfg.trainer), model().eval().requires_grad_(False), tok, world)
    ref = update_loop(ref_cfg, TorchTrainEngine(model(), ref_cfg.trainer), model().eval().requires_grad_(False), tok, 1)
    before = flat(ds.model, stage)
    norms, ref_norms, updates, ref_updates = [], [], [], []
    for step, n in enumerate(SIZES):
        batch = random_samples(n, seed=step, vocab=len(tok))
        for loop, into, count in ((ds, norms, updates), (ref, ref_norms, ref_updates)):
            m = loop.train_step(batch)
            loop.state.step += 1
            into.append(m.get("grad_norm", float("nan")))  # nan: this rank made no update
            count.append(len(loop.update_metrics))
    after = flat(ds.model, stage)
    both = [torch.zeros_like(after) for _ in range(world)]
    dist.all_gather(both, after)
    reference = torch.cat([p.detach().flatten() for p in ref.model.parameters()])
    return {"grad_norms": norms, "ref_grad_norms": ref_norms, "updates": updates, "ref_updates": ref_updates,
            "moved": float((after - before).abs().max()),
            "rank_diff": max(float((b - both[0]).abs().max()) for b in both),
            "ref_diff": float((after - reference).abs().max()),
            "ref_moved": float((reference - before).abs().max()),
            "finite": bool(torch.isfinite(after).all())}


def main() -> None:
    import torch.distributed as dist

    from streamrft.engine.training.deepspeed_engine import init_distributed

    out, stage = Path(sys.argv[1]), int(sys.argv[2])
    torch.set_num_threads(1)
    init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    import time
    t0 = time.monotonic()
    result = {}
    for name, overrides in CASES.items():
        result[name] = run_case(name, overrides, stage, out, rank, world)
        print(f"rank {rank} case {name} done at {time.monotonic() - t0:.1f}s", flush=True)
    if rank == 0:
        (out / f"result-{stage}.json").write_text(json.dumps(result, indent=1))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
