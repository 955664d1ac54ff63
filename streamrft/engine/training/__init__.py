"""Training engines behind one interface: plain torch (AdamW) or DeepSpeed ZeRO.

An engine owns the model and optimiser: `backward(loss)`, `step() -> grad_norm`,
`publishable_state_dict()`, `save(dir)` / `load(dir)`. `make_train_engine(cfg.trainer, model)`.
"""
from __future__ import annotations


def make_train_engine(trainer_cfg, model):
    if trainer_cfg.engine == "deepspeed":
        from streamrft.engine.training.deepspeed_engine import DeepSpeedTrainEngine

        return DeepSpeedTrainEngine(model, trainer_cfg)
    from streamrft.engine.training.torch_engine import TorchTrainEngine

    return TorchTrainEngine(model, trainer_cfg)
