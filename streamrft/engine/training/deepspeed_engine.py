"""DeepSpeed ZeRO (stage 0–3) training engine, data-parallel over `torchrun` processes.

`streamrft train` re-launches itself under torchrun with `trainer.deepspeed.num_gpus` processes
(gloo on CPU, nccl on GPU). Rank 0 does all Kafka and S3 I/O and broadcasts each batch; every
rank trains on its slice with the loss normalised by the WHOLE batch's token/sequence counts.
DeepSpeed averages gradients over ranks, so each rank's loss is scaled by the world size to keep
the sum-over-ranks contract of `engine.algorithms.aggregation`.

Every rank must make the same calls in the same order: `backward` and `step` (ZeRO's gradient
reduce-scatter and the sharded step), forwards of the model under ZeRO-3 (parameter gathers),
`publishable_state_dict` under ZeRO-3, `save`, `load`, `broadcast`, `barrier`.
A rank with no rows in an update still makes it, on a zero-weighted row (`consumers/update.py`).
"""
from __future__ import annotations

import os
import socket
from pathlib import Path

import torch

from streamrft.engine.training.torch_engine import warmup_factor


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed() -> None:
    import deepspeed
    import torch.distributed as dist

    if dist.is_initialized():
        return
    # a single process started without torchrun is a world of one
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")


class DeepSpeedTrainEngine:
    def __init__(self, model: torch.nn.Module, cfg):
        import deepspeed
        import torch.distributed as dist

        init_distributed()
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.is_main = self.rank == 0
        self.stage = cfg.deepspeed.zero_stage
        if torch.cuda.is_available():
            model = model.to(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}")
        ds_config = {
            "train_micro_batch_size_per_gpu": 1,  # batches are built by the trainer, not a DS loader
            "gradient_accumulation_steps": 1,
            "gradient_clipping": cfg.grad_clip if cfg.grad_clip > 0 else 0.0,
            "zero_optimization": {"stage": self.stage},
            "zero_allow_untested_optimizer": True,
            "bf16": {"enabled": str(next(model.parameters()).dtype) == "torch.bfloat16"},
            "steps_per_print": 10**9,
            **cfg.deepspeed.config,
        }
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr,
                                      weight_decay=cfg.weight_decay)  # frozen ones keep no optimiser state
        # the warm-up as the torch engine's; DeepSpeed steps it with each update and keeps it in its checkpoint
        warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: warmup_factor(k, cfg.warmup_steps))
        self.engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=warmup,
                                               config=ds_config)
        self.model = self.engine.module
        self.device = next(self.model.parameters()).device
        self.last_lr = 0.0  # the learning rate of the last update

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss * self.world)

    def step(self) -> float:
        self.last_lr = float(self.engine.get_lr()[0])  # this update's; the scheduler steps with it
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")

    def publishable_state_dict(self) -> dict[str, torch.Tensor]:
        """Full weights on rank 0 (collective under ZeRO-3: every rank must call it)."""
        if self.stage == 3:
            return self.engine._zero3_consolidated_16bit_state_dict()
        return self.model.state_dict()

    def save(self, directory: Path) -> None:
        state = self.publishable_state_dict()
        self.engine.save_checkpoint(str(directory), tag="ds")
        if self.is_main:
            self.model.save_pretrained(directory, state_dict=state)

    def load(self, directory: Path) -> None:
        path, _ = self.engine.load_checkpoint(str(directory), tag="ds")
        if path is None:
            raise RuntimeError(f"no DeepSpeed checkpoint under {directory}")

    # ---- collectives used by the trainer ---------------------------------------------------
    def broadcast(self, obj):
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier()

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()  # ZeRO-3 aborts at exit without it
