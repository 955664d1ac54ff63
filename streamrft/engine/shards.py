"""A version's files: safetensors shards (tied weights stored once), their upload as one version and
their download, and the file a LoRA checkpoint keeps its adapter in. The format below
`engine.weights` (which adds deltas, base models and export) and `engine.delta`, which both use it.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from streamrft.infra.objectstore import Manifest, WeightStore

ADAPTER_FILE = "adapter.safetensors"  # a LoRA checkpoint's adapter (a full one holds save_pretrained's shards)


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


def fetch_full_state_dict(store: WeightStore, model: str, version: int,
                          cache_dir: Path) -> tuple[dict[str, torch.Tensor], dict]:
    """`fetch_state_dict` of a version published whole (not a delta)."""
    dest = Path(cache_dir) / f"v{version}"
    try:
        manifest = store.fetch_version(model, version, dest)
        return load_shards(dest), manifest.meta
    finally:
        shutil.rmtree(dest, ignore_errors=True)
