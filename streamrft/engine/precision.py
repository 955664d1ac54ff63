"""Whether a requested bfloat16 (autocast, or a rollout engine's weights) is worth using on a device.

On a CPU without bfloat16 matrix instructions (no AVX512-BF16 / AMX: oneDNN reports no bf16
support), torch runs bfloat16 matmuls in its naive reference GEMM: measured on this project's
2-core machine kind, a SmolLM2-sized linear layer's forward and backward took 1,419 ms under
bfloat16 autocast against 99 ms in float32 (one thread), and a SmolLM2 LoRA trainer step 165 s
instead of a few; SmolLM2-135M sampling 16 completions of 12 tokens took 5.6 s with bfloat16
weights against 3.0 s in float32. There the trainer and the rollout engine keep float32 and say so
once.
"""
from __future__ import annotations

import functools
import logging

import torch

log = logging.getLogger(__name__)


def cpu_bf16_fast() -> bool:
    """oneDNN has bfloat16 kernels for this CPU."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


@functools.lru_cache(maxsize=None)
def usable_autocast(device_type: str, requested: str | None) -> str | None:
    """`requested` (a torch dtype name, or None: no autocast), or None where it would be slower than
    float32: bfloat16 on a CPU without bfloat16 kernels."""
    if requested == "bfloat16" and device_type == "cpu" and not cpu_bf16_fast():
        log.warning("trainer.autocast=bfloat16 ignored: this CPU has no bfloat16 matrix kernels (oneDNN), "
                    "where bfloat16 runs ~14x slower than float32; training in float32")
        return None
    return requested


@functools.lru_cache(maxsize=None)
def usable_dtype(device: str, requested: str) -> str:
    """The weights' dtype for a rollout engine on `device`: `requested`, or float32 where bfloat16
    would be slower (a CPU without bfloat16 kernels)."""
    if requested == "bfloat16" and device.split(":")[0] == "cpu" and not cpu_bf16_fast():
        log.warning("explorer.engine.dtype=bfloat16 ignored: this CPU has no bfloat16 matrix kernels (oneDNN), "
                    "where bfloat16 samples ~2x slower than float32; sampling in float32")
        return "float32"
    return requested
