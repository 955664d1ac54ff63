"""Delta weight versions: a version published as the exact difference from the one before it.

A delta version's file is `delta-00000.st.zst`, one zstd stream of every tensor's raw bytes XOR
the same tensor's bytes in version `delta_from` (same dtype and shape), or, for a tensor that is
new or changed shape or dtype, its own bytes (named in `meta["full_tensors"]`), in the order of
`meta["tensors"]` (name, dtype, shape, op), encoded and decoded a tensor at a time. Unchanged
bytes XOR to zeros, which zstd squeezes away: after one AdamW step at lr 1e-6 about 98% of a bf16
model's elements do not move by one ulp (`benchmarks/weight_delta.py`: 38.6x fewer bytes).

Every delta version's meta says `delta_from` (N-1), `snapshot` (the full version its chain starts
at), `full_every`, and `tensor_sha256`: the sha256 of every RECONSTRUCTED tensor (dtype, shape,
bytes), so a reader that applied the delta onto the wrong base, or onto a copy that drifted, knows.
The manifest's own sha256 of each file guards the bytes in S3 as for every version. A full version
every `full_every` versions (and whenever the publisher has no previous state: a restart) bounds
the chain a new reader replays; `WeightStore.gc` keeps every version a kept version's chain needs.

`DeltaPublisher` is the trainer's side (it keeps a CPU copy of the last version published);
`fetch_chain` the reader's: onto the reader's own copy of version N-1 when it has it, else from the
chain's full snapshot, and from the snapshot again when applying onto its own copy failed.
"""
from __future__ import annotations

import hashlib
import logging
import shutil
import tempfile
from pathlib import Path

import torch
from minio.error import S3Error

from streamrft.infra.objectstore import CorruptVersionError, Manifest, WeightStore

log = logging.getLogger(__name__)

DELTA_SUFFIX = ".st.zst"
ZSTD_LEVEL = 3


def is_delta(meta: dict) -> bool:
    return "delta_from" in meta


def canonical(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state_dict` as a version stores it: tied weights once (the first name, as `save_shards`),
    each a contiguous CPU tensor (the caller's own tensors where they are already that)."""
    seen: set[int] = set()
    out: dict[str, torch.Tensor] = {}
    for name, t in state_dict.items():
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        out[name] = t.detach().to("cpu").contiguous()
    return out


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes of a contiguous CPU tensor as a flat uint8 view (no copy)."""
    return t.reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)


def tensor_sha256(t: torch.Tensor) -> str:
    h = hashlib.sha256(f"{t.dtype}|{tuple(t.shape)}|".encode())
    h.update(_bytes(t.contiguous()).numpy().data)
    return h.hexdigest()


def state_sha256(state: dict[str, torch.Tensor], threads: int = 2) -> dict[str, str]:
    """`tensor_sha256` of every tensor, `threads` at a time (hashlib lets go of the GIL)."""
    if threads <= 1:
        return {name: tensor_sha256(t) for name, t in state.items()}
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(threads) as pool:
        return dict(zip(state, pool.map(tensor_sha256, state.values())))


def _xor(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a XOR b over their raw bytes, as flat uint8 (8 bytes at a time where the length allows)."""
    a8, b8 = _bytes(a), _bytes(b)
    if a8.numel() % 8 == 0 and a8.numel():
        try:
            return torch.bitwise_xor(a8.view(torch.int64), b8.view(torch.int64)).view(torch.uint8)
        except RuntimeError:  # a view at an offset that is no multiple of 8
            pass
    return torch.bitwise_xor(a8, b8)


def _zstd():
    import zstandard

    return zstandard


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise CorruptVersionError(f"unknown dtype {name!r} in a delta's index")
    return dtype


def encode_delta(prev: dict[str, torch.Tensor], new: dict[str, torch.Tensor],
                 out_dir: Path) -> tuple[list[Path], list[dict]]:
    """Write the delta from `prev` to `new` (both `canonical`) as one zstd stream `delta-00000.st.zst`:
    per tensor, in the order of the index returned, its bytes XOR `prev`'s (`"op": "xor"`), or its own
    bytes when `prev` has no tensor of that name, dtype and shape (`"op": "full"`). Streamed a tensor
    at a time: no copy of the whole state is made. Returns (files, index)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    cctx = _zstd().ZstdCompressor(level=ZSTD_LEVEL)
    index: list[dict] = []
    path = out_dir / f"delta-00000{DELTA_SUFFIX}"
    with open(path, "wb") as fh, cctx.stream_writer(fh, closefd=False) as writer:
        for name, t in new.items():
            p = prev.get(name)
            xor = p is not None and p.dtype == t.dtype and p.shape == t.shape
            payload = _xor(p, t) if xor else _bytes(t)
            writer.write(payload.numpy().data)
            index.append({"name": name, "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                          "op": "xor" if xor else "full"})
    return [path], index


def _read_exact(reader, n: int) -> torch.Tensor:
    buf = torch.empty(n, dtype=torch.uint8)
    view, got = memoryview(buf.numpy()), 0
    while got < n:
        k = reader.readinto(view[got:])
        if not k:
            raise CorruptVersionError(f"a delta stream ended {n - got} bytes short")
        got += k
    return buf


def decode_delta(prev: dict[str, torch.Tensor], files: list[Path], index: list[dict]) -> dict[str, torch.Tensor]:
    """The state a delta's stream makes of `prev` (new tensors; `prev` is left as it was)."""
    (path,) = files
    out: dict[str, torch.Tensor] = {}
    with open(path, "rb") as fh, _zstd().ZstdDecompressor().stream_reader(fh) as reader:
        for entry in index:
            name, dtype, shape = entry["name"], _dtype(entry["dtype"]), tuple(entry["shape"])
            numel = 1
            for d in shape:
                numel *= d
            buf = _read_exact(reader, numel * torch.empty(0, dtype=dtype).element_size())
            if entry["op"] == "xor":
                p = prev.get(name)
                if p is None or p.dtype != dtype or tuple(p.shape) != shape:
                    raise CorruptVersionError(f"delta tensor {name} does not fit the previous version's")
                torch.bitwise_xor(buf, _bytes(p.contiguous()), out=buf)
            out[name] = buf.view(dtype).reshape(shape) if numel else torch.empty(shape, dtype=dtype)
        if reader.read(1):
            raise CorruptVersionError(f"{path.name}: bytes after the last tensor of the delta's index")
    return out


class DeltaPublisher:
    """Publishes full-weight versions as deltas from the previous one, a full snapshot every
    `full_every` versions; keeps a CPU copy of the last version it published (one more copy of
    the weights in host memory)."""

    def __init__(self, full_every: int, max_shard_bytes: int = 2 << 30):
        if full_every < 1:
            raise ValueError(f"full_every must be >= 1 (got {full_every})")
        self.full_every = full_every
        self.max_shard_bytes = max_shard_bytes
        self.prev: dict[str, torch.Tensor] | None = None
        self.prev_version: int | None = None
        self.snapshot: int | None = None  # the full version the current chain starts at

    def wants_full(self, version: int) -> bool:
        return (self.prev is None or self.prev_version != version - 1 or self.snapshot is None
                or version - self.snapshot >= self.full_every)

    def publish(self, store: WeightStore, model: str, version: int, state_dict: dict[str, torch.Tensor],
                meta: dict | None = None) -> Manifest:
        from streamrft.engine.weights import publish_state_dict

        new = canonical(state_dict)
        meta = dict(meta or {})
        # a copy for the next delta: the trainer keeps updating its tensors in place
        copy = {k: v.clone() if v.data_ptr() == state_dict[k].data_ptr() else v for k, v in new.items()}
        if self.wants_full(version):
            manifest = publish_state_dict(store, model, version, new, meta={**meta, "full_every": self.full_every},
                                          max_shard_bytes=self.max_shard_bytes)
            self.snapshot = version
        else:
            tmp = Path(tempfile.mkdtemp(prefix=f"delta-v{version}-"))
            try:
                from concurrent.futures import ThreadPoolExecutor

                with ThreadPoolExecutor(1) as pool:  # the checksums while the delta is encoded
                    digests = pool.submit(state_sha256, new, 1)
                    files, index = encode_delta(self.prev, new, tmp)
                meta.update(delta_from=self.prev_version, snapshot=self.snapshot, full_every=self.full_every,
                            tensors=index, full_tensors=[e["name"] for e in index if e["op"] == "full"],
                            tensor_sha256=digests.result())
                manifest = store.publish_version(model, version, files, meta)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        self.prev, self.prev_version = copy, version
        return manifest


# what reading one delta may fail with and a replay from the snapshot may fix: a corrupt or
# missing object, a reconstruction whose checksums do not match
_DELTA_ERRORS = (CorruptVersionError, S3Error, ValueError, RuntimeError, KeyError)


def apply_delta(store: WeightStore, model: str, version: int, prev: dict[str, torch.Tensor], prev_version: int,
                cache_dir: Path, manifest: Manifest | None = None) -> dict[str, torch.Tensor]:
    """Version `version` (a delta) made from the reader's `prev`, which must be version
    `delta_from`; every reconstructed tensor checked against the manifest. Raises CorruptVersionError."""
    dest = Path(cache_dir) / f"v{version}-delta"
    try:
        manifest = store.fetch_version(model, version, dest)  # each file's size and sha256 checked
        meta = manifest.meta
        if meta.get("delta_from") != prev_version:
            raise CorruptVersionError(f"{model} v{version} is a delta from v{meta.get('delta_from')}, "
                                      f"not from v{prev_version}")
        files = [dest / name for name in manifest.files]
        state = decode_delta(prev, files, meta["tensors"])
        expect = meta["tensor_sha256"]
        if set(state) != set(expect):
            odd = sorted(set(state) ^ set(expect))[:5]
            raise CorruptVersionError(f"{model} v{version}: reconstructed tensors {odd} differ from the manifest's")
        for name, digest in state_sha256(state).items():
            if digest != expect[name]:
                raise CorruptVersionError(f"{model} v{version}: reconstructed {name} does not match its sha256")
        return state
    finally:
        shutil.rmtree(dest, ignore_errors=True)


def fetch_chain(store: WeightStore, model: str, version: int, cache_dir: Path,
                have: tuple[int, dict[str, torch.Tensor]] | None = None) -> tuple[dict[str, torch.Tensor], dict]:
    """(state dict, manifest meta) of `version`, full or delta. A delta is applied onto `have` =
    (its version, its state) when `have` lies on the chain (the deltas since replayed); when that
    fails, or without `have`, the chain is replayed from its full snapshot. Raises what the
    snapshot's chain fails with (CorruptVersionError, S3Error...)."""
    from streamrft.engine.weights import fetch_full_state_dict

    manifest = store.read_manifest(model, version)
    meta = manifest.meta
    if not is_delta(meta):
        return fetch_full_state_dict(store, model, version, cache_dir)
    snapshot = meta["snapshot"]
    if have is not None and snapshot <= have[0] < version:
        try:
            return _replay(store, model, have[0], have[1], version, cache_dir), meta
        except _DELTA_ERRORS as e:
            log.warning("%s v%d from the local v%d failed (%s: %s): replaying from the full snapshot v%d",
                        model, version, have[0], type(e).__name__, e, snapshot)
    state, _ = fetch_full_state_dict(store, model, snapshot, cache_dir)
    return _replay(store, model, snapshot, state, version, cache_dir), meta


def _replay(store, model, start: int, state: dict, version: int, cache_dir: Path) -> dict:
    for v in range(start + 1, version + 1):
        state = apply_delta(store, model, v, state, v - 1, cache_dir)
    return state
