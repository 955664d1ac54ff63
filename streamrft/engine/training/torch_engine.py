"""Single-process torch training: AdamW, linear learning-rate warm-up, global-norm clipping,
optimiser state checkpoints.

With `lora` (a `config.LoraSpec`) the model is wrapped with peft adapters (`engine.lora`): only they
train, a published version and a checkpoint hold them alone (with the optimiser's state of them).
"""
from __future__ import annotations

from pathlib import Path

import torch

from streamrft.engine.shards import ADAPTER_FILE, load_shards


def warmup_factor(update: int, warmup_steps: int) -> float:
    """The learning rate's multiplier at optimiser update `update` (from 0): linear over `warmup_steps`."""
    return 1.0 if warmup_steps <= 0 else min(1.0, (update + 1) / warmup_steps)


class TorchTrainEngine:
    def __init__(self, model: torch.nn.Module, cfg, lora=None):
        if lora is not None:
            from streamrft.engine.lora import wrap

            model = wrap(model, lora)
        self.model = model
        self.lora = lora
        self.grad_clip = cfg.grad_clip
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.lr, self.warmup_steps = cfg.lr, cfg.warmup_steps
        self.updates = 0  # optimiser updates made (restored from the optimiser's state on load)
        self.last_lr = 0.0  # the learning rate of the last update
        self.is_main = True

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> float:
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip if self.grad_clip > 0 else float("inf"))
        self.last_lr = self.lr * warmup_factor(self.updates, self.warmup_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = self.last_lr
        self.optimizer.step()
        self.updates += 1
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def publishable_state_dict(self) -> dict[str, torch.Tensor]:
        """Full weights, or with LoRA the adapter alone under the base model's names."""
        if self.lora is not None:
            from streamrft.engine.lora import adapter_state_dict

            return adapter_state_dict(self.model)
        return self.model.state_dict()

    def save(self, directory: Path) -> None:
        if self.lora is not None:
            from safetensors.torch import save_file

            save_file({k: v.detach().contiguous() for k, v in self.publishable_state_dict().items()},
                      str(directory / ADAPTER_FILE))
        else:
            self.model.save_pretrained(directory)
        torch.save(self.optimizer.state_dict(), directory / "optimizer.pt")

    def load(self, directory: Path) -> None:
        if self.lora is not None:
            from safetensors.torch import load_file

            from streamrft.engine.lora import load_adapter

            if not (directory / ADAPTER_FILE).exists():
                raise RuntimeError(f"checkpoint {directory} holds no LoRA adapter ({ADAPTER_FILE}): was it written "
                                   "without model.lora?")
            load_adapter(self.model, load_file(str(directory / ADAPTER_FILE)))
        else:
            missing, unexpected = self.model.load_state_dict(load_shards(directory), strict=False)
            if unexpected:  # weights saved under the model's on-disk names (transformers renames some
                # models' weights in save_pretrained, e.g. LLaVA's): let transformers map them back
                saved = type(self.model).from_pretrained(str(directory), dtype=next(self.model.parameters()).dtype,
                                                         local_files_only=True)
                missing, unexpected = self.model.load_state_dict(saved.state_dict(), strict=False)
            if unexpected or any("lm_head" not in k for k in missing):
                raise RuntimeError(f"checkpoint {directory} does not match the model: missing {missing}, "
                                   f"unexpected {unexpected}")
        self.optimizer.load_state_dict(torch.load(directory / "optimizer.pt", weights_only=True))
        steps = [float(s["step"]) for s in self.optimizer.state.values() if "step" in s]
        self.updates = int(max(steps, default=0))
