"""Training engines behind one interface: plain torch (AdamW) or DeepSpeed ZeRO.

An engine owns the model and optimiser: `model` (what to run forward: with LoRA, the peft-wrapped
model), `backward(loss)`, `step() -> grad_norm`, `publishable_state_dict()`, `save(dir)` / `load(dir)`.
`make_train_engine(cfg.trainer, model, cfg.model.lora)`.
"""
from __future__ import annotations


def make_train_engine(trainer_cfg, model, lora=None):
    """`lora` (a `config.LoraSpec`): train adapters on the frozen `model` (the torch engine only)."""
    if trainer_cfg.freeze_vision_tower:
        from streamrft.engine.vlm import freeze_vision_tower

        freeze_vision_tower(model)
    if trainer_cfg.gradient_checkpointing:
        enable_checkpointing(model)
    if trainer_cfg.engine == "deepspeed":
        if lora is not None:
            raise ValueError("model.lora needs trainer.engine='torch'")
        from streamrft.engine.training.deepspeed_engine import DeepSpeedTrainEngine

        return DeepSpeedTrainEngine(model, trainer_cfg)
    from streamrft.engine.training.torch_engine import TorchTrainEngine

    return TorchTrainEngine(model, trainer_cfg, lora)


def enable_checkpointing(model) -> int:
    """`trainer.gradient_checkpointing`: every decoder layer (transformers' `GradientCheckpointingLayer`)
    keeps only its input and is recomputed in backward (non-reentrant). transformers checkpoints a
    layer only while it is in training mode; the trainer's model stays in eval mode (no dropout:
    recomputed log-probs must equal the recorded ones), so only the layers themselves are flagged,
    not what is inside them. Returns the layers checkpointed."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    if not layers or not hasattr(model, "gradient_checkpointing_enable"):
        raise ValueError(f"trainer.gradient_checkpointing: {type(model).__name__} has no checkpointable layers")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    for config in (model.config, getattr(model.config, "text_config", None)):
        if config is not None and hasattr(config, "use_cache"):
            config.use_cache = False  # no KV cache in a training forward
    for layer in layers:
        layer.training = True
    return len(layers)

