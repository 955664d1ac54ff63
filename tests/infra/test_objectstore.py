"""Weight versions in the real S3 server (session stack): publish/fetch, verification, GC."""
from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from streamrft.infra.objectstore import MANIFEST, CorruptVersionError, WeightStore


def _tiny_module(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def _shards(module: torch.nn.Module, out: Path) -> list[Path]:
    """The state dict in two safetensors shards, as a Hugging Face save would split it."""
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in module.state_dict().items()}
    names = sorted(state)
    paths = []
    for i, part in enumerate((names[: len(names) // 2], names[len(names) // 2:])):
        path = out / f"model-{i + 1:05d}-of-00002.safetensors"
        save_file({k: state[k] for k in part}, str(path))
        paths.append(path)
    return paths


@pytest.fixture
def store(stack) -> WeightStore:
    store = WeightStore(stack.s3)
    store.ensure_bucket()
    return store


def test_publish_fetch_round_trip(store, namespace, tmp_path):
    module = _tiny_module(0)
    shards = _shards(module, tmp_path / "src")
    manifest = store.publish_version(namespace, 1, shards, meta={"step": 1})
    assert set(manifest.files) == {p.name for p in shards}
    assert store.list_versions(namespace) == [1]
    assert store.latest_version(namespace) == 1

    fetched = store.fetch_version(namespace, 1, tmp_path / "dst")
    assert fetched.files == manifest.files and fetched.meta == {"step": 1}
    assert (tmp_path / "dst" / MANIFEST).read_bytes() == manifest.to_bytes()
    state = {}
    for p in shards:
        state.update(load_file(str(tmp_path / "dst" / p.name)))
    expected = module.state_dict()
    assert set(state) == set(expected)
    for k in expected:
        assert torch.equal(state[k], expected[k]), k

    clone = _tiny_module(1)
    clone.load_state_dict(state)
    x = torch.randn(3, 8)
    assert torch.equal(clone(x), module(x))


@pytest.mark.parametrize("same_size", [True, False], ids=["same-size", "truncated"])
def test_corrupted_shard_is_rejected(store, namespace, tmp_path, same_size):
    shards = _shards(_tiny_module(0), tmp_path / "src")
    store.publish_version(namespace, 1, shards)
    victim = shards[1]
    original = victim.read_bytes()
    # flip bytes in the middle of the tensor data (same size), or drop the tail
    bad = original[:-8] + bytes(b ^ 0xFF for b in original[-8:]) if same_size else original[:-8]
    store.client.put_object(store.bucket, f"{namespace}/v1/{victim.name}", io.BytesIO(bad), len(bad))

    with pytest.raises(CorruptVersionError, match=victim.name):
        store.fetch_version(namespace, 1, tmp_path / "dst")


def test_version_without_manifest_is_invisible(store, namespace, tmp_path):
    shards = _shards(_tiny_module(0), tmp_path / "src")
    store.publish_version(namespace, 1, shards)
    # a publisher that died before writing the manifest: shards only, at a higher version
    for version in (2, 9):
        for p in shards:
            store.client.fput_object(store.bucket, f"{namespace}/v{version}/{p.name}", str(p))
    assert store.list_versions(namespace) == [1]
    assert store.latest_version(namespace) == 1
    assert store.latest_version(f"{namespace}-none") is None


def test_gc_keeps_the_newest(store, namespace, tmp_path):
    shards = _shards(_tiny_module(0), tmp_path / "src")
    for version in range(1, 6):
        store.publish_version(namespace, version, shards)
    assert store.list_versions(namespace) == [1, 2, 3, 4, 5]

    assert store.gc(namespace, keep=2) == [1, 2, 3]
    assert store.list_versions(namespace) == [4, 5]
    left = {o.object_name.split("/")[1] for o in store.client.list_objects(store.bucket, prefix=f"{namespace}/",
                                                                          recursive=True)}
    assert left == {"v4", "v5"}  # the deleted versions' shards are gone too, not just their manifests
    assert store.gc(namespace, keep=2) == []
    store.fetch_version(namespace, 5, tmp_path / "dst")  # what is kept is intact
    with pytest.raises(ValueError):
        store.gc(namespace, keep=0)
