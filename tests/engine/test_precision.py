"""bfloat16 autocast is kept where the CPU has bfloat16 kernels and dropped (float32) where torch
would run it in its naive GEMM."""
from __future__ import annotations

import streamrft.engine.precision as precision


def test_bf16_autocast_is_dropped_on_a_cpu_without_bf16_kernels(monkeypatch, caplog):
    precision.usable_autocast.cache_clear()
    monkeypatch.setattr(precision, "cpu_bf16_fast", lambda: False)
    assert precision.usable_autocast("cpu", "bfloat16") is None
    assert "trainer.autocast=bfloat16 ignored" in caplog.text
    assert precision.usable_autocast("cpu", None) is None
    assert precision.usable_autocast("cuda", "bfloat16") == "bfloat16"  # GPUs: as asked
    precision.usable_autocast.cache_clear()
    monkeypatch.setattr(precision, "cpu_bf16_fast", lambda: True)
    assert precision.usable_autocast("cpu", "bfloat16") == "bfloat16"
    precision.usable_autocast.cache_clear()

