"""Training engines behind one interface: plain torch (AdamW) or DeepSpeed ZeRO.

An engine owns the model and optimiser: `model` (what to run forward: with LoRA, the peft-wrapped
model), `backward(loss)`, `step() -> grad_norm`, `publishable_state_dict()`, `save(dir)` / `load(dir)`.
`make_train_engine(cfg.trainer, model, cfg.model.lora)`.
"""
from __future__ import annotations


def make_train_engine(trainer_cfg, model, lora=None):
    """`lora` (a `config.LoraSpec`): train adapters on the frozen `model` (the torch engine only)."""
    if trainer_cfg.engine == "deepspeed":
        if lora is not None:
            raise ValueError("model.lora needs trainer.engine='torch'")
        from streamrft.engine.training.deepspeed_engine import DeepSpeedTrainEngine

        return DeepSpeedTrainEngine(model, trainer_cfg)
    from streamrft.engine.training.torch_engine import TorchTrainEngine

    return TorchTrainEngine(model, trainer_cfg, lora)
