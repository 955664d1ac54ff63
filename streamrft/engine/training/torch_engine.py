"""Single-process torch training: AdamW, global-norm clipping, optimiser state checkpoints."""
from __future__ import annotations

from pathlib import Path

import torch


class TorchTrainEngine:
    def __init__(self, model: torch.nn.Module, cfg):
        self.model = model
        self.grad_clip = cfg.grad_clip
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.is_main = True

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> float:
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip if self.grad_clip > 0 else float("inf"))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def publishable_state_dict(self) -> dict[str, torch.Tensor]:
        return self.model.state_dict()

    def save(self, directory: Path) -> None:
        self.model.save_pretrained(directory)
        torch.save(self.optimizer.state_dict(), directory / "optimizer.pt")

    def load(self, directory: Path) -> None:
        from streamrft.engine.weights import load_shards

        missing, unexpected = self.model.load_state_dict(load_shards(directory), strict=False)
        if unexpected or any("lm_head" not in k for k in missing):
            raise RuntimeError(f"checkpoint {directory} does not match the model: missing {missing}, unexpected {unexpected}")
        self.optimizer.load_state_dict(torch.load(directory / "optimizer.pt", weights_only=True))
