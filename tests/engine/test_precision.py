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



def test_bf16_engine_weights_become_float32_on_a_cpu_without_bf16_kernels(monkeypatch, caplog):
    precision.usable_dtype.cache_clear()
    monkeypatch.setattr(precision, "cpu_bf16_fast", lambda: False)
    assert precision.usable_dtype("cpu", "bfloat16") == "float32"
    assert "explorer.engine.dtype=bfloat16 ignored" in caplog.text
    assert precision.usable_dtype("cpu", "float16") == "float16"
    assert precision.usable_dtype("cuda:0", "bfloat16") == "bfloat16"
    precision.usable_dtype.cache_clear()
    monkeypatch.setattr(precision, "cpu_bf16_fast", lambda: True)
    assert precision.usable_dtype("cpu", "bfloat16") == "bfloat16"
    precision.usable_dtype.cache_clear()


def test_the_engine_factory_applies_it(monkeypatch, tmp_path):
    """engine_from_config hands the transformers engine float32 for a bfloat16 request here."""
    import streamrft.engine.rollout as rollout
    from streamrft.config import RunConfig

    precision.usable_dtype.cache_clear()
    monkeypatch.setattr(precision, "cpu_bf16_fast", lambda: False)
    seen = {}
    monkeypatch.setattr(rollout, "make_engine", lambda type, path, **kw: seen.update(kw) or object())
    cfg = RunConfig.model_validate({"namespace": "p", "model": {"path": str(tmp_path)},
                                    "explorer": {"engine": {"dtype": "bfloat16"}}})
    rollout.engine_from_config(cfg)
    assert seen["dtype"] == "float32"
    precision.usable_dtype.cache_clear()
