"""Moving a policy's weights between a torch module and the weight store.

`publish_state_dict` writes safetensors shards (tied weights stored once) and publishes them as
one version; `fetch_state_dict` downloads a version, verifies its manifest and loads it, with the
manifest's meta (`LoraSpec.from_manifest(meta)`: full weights or a LoRA adapter); `export_version`
writes a version as a plain HF directory (`AutoModelForCausalLM.from_pretrained`), an adapter
merged into the base weights.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from streamrft.infra.objectstore import Manifest, WeightStore


def save_shards(state_dict: dict[str, torch.Tensor], out_dir: Path, max_shard_bytes: int = 2 << 30) -> list[Path]:
    """Write `state_dict` as `model-0000k.safetensors` shards of at most `max_shard_bytes`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    seen: dict[int, str] = {}
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in state_dict.items():
        ptr = t.data_ptr()
        if ptr in seen:  # tied weights (embeddings = lm_head): store once, the model re-ties them
            continue
        seen[ptr] = name
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t.detach().to("cpu").contiguous()
        size += nbytes
    paths = []
    for i, shard in enumerate(shards):
        path = out_dir / f"model-{i:05d}.safetensors"
        save_file(shard, str(path))
        paths.append(path)
    return paths


def publish_state_dict(store: WeightStore, model: str, version: int, state_dict: dict[str, torch.Tensor],
                       meta: dict | None = None, max_shard_bytes: int = 2 << 30) -> Manifest:
    tmp = Path(tempfile.mkdtemp(prefix=f"publish-v{version}-"))
    try:
        return store.publish_version(model, version, save_shards(state_dict, tmp, max_shard_bytes), meta)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_shards(directory: Path) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for path in sorted(Path(directory).glob("*.safetensors")):
        state.update(load_file(str(path)))
    return state


def fetch_state_dict(store: WeightStore, model: str, version: int,
                     cache_dir: Path) -> tuple[dict[str, torch.Tensor], dict]:
    """(state dict, manifest meta) of version `version`, downloaded and verified into
    `cache_dir/v<N>` and loaded; the files are dropped."""
    dest = Path(cache_dir) / f"v{version}"
    try:
        manifest = store.fetch_version(model, version, dest)
        return load_shards(dest), manifest.meta
    finally:
        shutil.rmtree(dest, ignore_errors=True)


def export_version(store: WeightStore, model: str, version: int, base_dir: str | Path, out_dir: str | Path) -> Path:
    """Version `version` of `model` (the store key, `RunConfig.weights_key`) as a plain HF directory:
    `base_dir`'s config, tokenizer, chat template and generation config with the version's weights in
    one `model.safetensors` (a tied output head stays tied through the config, as in `base_dir`).
    A LoRA version is merged into `base_dir`'s weights (the base it was trained on)."""
    from streamrft.config import LoraSpec

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    state, meta = fetch_state_dict(store, model, version, out_dir / ".fetch")
    shutil.rmtree(out_dir / ".fetch", ignore_errors=True)
    lora = LoraSpec.from_manifest(meta)
    if lora is not None:
        from streamrft.engine.lora import merged_weights

        base = load_shards(base_dir)
        if not base:
            raise FileNotFoundError(f"{base_dir} holds no .safetensors weights to merge LoRA version v{version} into")
        state = {**base, **merged_weights(base, state, lora.scale)}
    for path in Path(base_dir).iterdir():
        weights = path.suffix in (".safetensors", ".bin") or path.name.endswith(".index.json")
        if path.is_file() and not weights:
            shutil.copy2(path, out_dir / path.name)
    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    return out_dir
