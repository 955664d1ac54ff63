"""Rollout engines behind one interface (`base.RolloutEngine`): transformers on CPU, vLLM on GPU.

`make_engine("transformers" | "vllm", model_path, **kwargs)` imports the chosen engine late, so
importing this package pulls in neither torch nor vllm.
"""
from __future__ import annotations

import logging

from streamrft.engine.rollout.base import Completion, RolloutEngine, SamplingParams

ENGINE_TYPES = ("transformers", "vllm")


def make_engine(type: str, model_path: str, **kwargs) -> RolloutEngine:
    """An engine of `type` serving the HF model directory `model_path`."""
    if type == "transformers":
        from streamrft.engine.rollout.hf import TransformersEngine

        return TransformersEngine(model_path, **kwargs)
    if type == "vllm":
        from streamrft.engine.rollout.vllm_engine import VLLMEngine

        return VLLMEngine(model_path, **kwargs)
    raise ValueError(f"unknown engine type {type!r}; allowed: {', '.join(ENGINE_TYPES)}")


def engine_from_config(cfg) -> RolloutEngine:
    """The rollout engine a RunConfig's `explorer.engine` section describes, serving `model.path`."""
    e = cfg.explorer.engine
    # vLLM must enable LoRA when it is built; the transformers engine merges whatever comes
    extra = ({"gpu_memory_utilization": e.gpu_memory_utilization, "kv_cache_gib": e.kv_cache_gib, "lora": cfg.model.lora,
              "max_model_len": e.max_model_len,
              **({} if e.max_images is None else {"limit_mm_per_prompt": {"image": e.max_images, "video": 0}})}
             if e.type == "vllm" else {})
    dtype = e.dtype or cfg.model.dtype
    if e.type == "transformers":  # vLLM runs on GPUs, where bfloat16 is as asked
        from streamrft.engine.precision import usable_dtype

        dtype = usable_dtype(e.device, dtype)
    engine = make_engine(e.type, cfg.model.path, device=e.device, dtype=dtype, max_batch=e.max_batch, **extra)
    logging.getLogger(__name__).info("rollout engine: %s on %s, %s", e.type, e.device, dtype)
    return engine


__all__ = ["engine_from_config", "Completion", "ENGINE_TYPES", "RolloutEngine", "SamplingParams", "make_engine"]
