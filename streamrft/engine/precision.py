"""Whether a requested autocast dtype is worth using on a device.

On a CPU without bfloat16 matrix instructions (no AVX512-BF16 / AMX: oneDNN reports no bf16
support), torch runs bfloat16 matmuls in its naive reference GEMM: measured on this project's
2-core machine kind, a SmolLM2-sized linear layer's forward and backward took 1,419 ms under
bfloat16 autocast against 99 ms in float32 (one thread), and a SmolLM2 LoRA trainer step 165 s
instead of a few. There the trainer keeps float32 and says so once.
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
