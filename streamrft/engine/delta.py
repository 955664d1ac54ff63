"""Delta weight versions: a version published as the exact difference from the one before it.

A delta version's files are `delta-0000<i>.st.zst`, `DELTA_PARTS` zstd streams written and read
in parallel (one thread each: zstd, torch and xxhash let go of the GIL), which share the tensors
out between them by size. Each stream holds its tensors' raw bytes XOR the same tensor's bytes in
version `delta_from` (same dtype and shape), or, for a tensor that is new or changed shape or
dtype, its own bytes (named in `meta["full_tensors"]`), in the order of `meta["tensors"]` (name,
dtype, shape, op, file, xxh3_128), encoded and decoded a tensor at a time. Unchanged bytes XOR to
zeros: after one AdamW step at lr 1e-6 about 98% of a bf16 model's elements do not move by one ulp
(`benchmarks/weight_delta.py`). A tensor with at most `SPARSE_MAX_DENSITY` of its elements changed
is stored sparse (`"op": "sparse_xor"`, `"nnz"`: how many): the gaps between the changed elements'
indices (int32; int64 in a tensor of 2^31 elements or more) and then their XORs (an integer of the
element's size), each array byte-plane shuffled (all first bytes, then all second bytes...) before
zstd. Against the dense `"op": "xor"` (every element's XOR, zeros included, which zstd squeezes)
that is 13.65 MB instead of 25.55 MB on the 0.5B model; encoding costs about the same (finding the
changed elements costs what zstd saves), decoding a little less. Denser tensors stay dense.
The publisher keeps one XOR buffer per stream (up to `DELTA_PARTS` x the largest tensor of host
memory) and hands the base an owned version replaced back to the trainer (`take_spare`), to copy
its next version into: fresh pages are written 3-4x slower than memory written before.

Every delta version's meta says `delta_from` (N-1), `snapshot` (the full version its chain starts
at), `full_every`, and per tensor `xxh3_128`: the 128-bit xxh3 of every RECONSTRUCTED tensor
(dtype, shape, bytes), so a reader that applied the delta onto the wrong base, or onto a copy
that drifted, knows. It is a checksum against accidents, at 10-20 GB/s where sha256 ran at 1.5
(deltas written before it carry `tensor_sha256`, which readers still check). The manifest's
sha256 of each file guards the bytes in S3 as for every version. A full version every
`full_every` versions (and whenever the publisher has no previous state: a restart) bounds the
chain a new reader replays; `WeightStore.gc` keeps every version a kept version's chain needs.

`DeltaPublisher` is the trainer's side (it keeps a CPU copy of the last version published);
`fetch_chain` the reader's: onto the reader's own copy of version N-1 when it has it, else from the
chain's full snapshot, and from the snapshot again when applying onto its own copy failed.
"""
from __future__ import annotations

import hashlib
import logging
import shutil
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from minio.error import S3Error

from streamrft.infra.objectstore import CorruptVersionError, Manifest, WeightStore

log = logging.getLogger(__name__)

DELTA_SUFFIX = ".st.zst"
ZSTD_LEVEL = 1  # as small as 3 on XOR deltas (31.3 vs 31.4 MB for 1.2 GB), faster both ways
DELTA_PARTS = 2  # zstd streams per delta, each written and read by a thread of its own
# the largest share of a tensor's elements that may change for it to be stored sparse; above it, a
# changed element's gap and XOR (4 + 2 bytes for bf16) stop being clearly fewer than dense XOR bytes
SPARSE_MAX_DENSITY = 0.125
_INTS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}  # an element's bits, by size


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


def tensor_xxh3(t: torch.Tensor) -> str:
    """The 128-bit xxh3 of a tensor's dtype, shape and bytes (hex)."""
    import xxhash

    h = xxhash.xxh3_128(f"{t.dtype}|{tuple(t.shape)}|".encode())
    h.update(_bytes(t.contiguous()).numpy().data)
    return h.hexdigest()


def tensor_sha256(t: torch.Tensor) -> str:
    h = hashlib.sha256(f"{t.dtype}|{tuple(t.shape)}|".encode())
    h.update(_bytes(t.contiguous()).numpy().data)
    return h.hexdigest()


def state_sha256(state: dict[str, torch.Tensor], threads: int = 2) -> dict[str, str]:
    """`tensor_sha256` of every tensor, `threads` at a time (hashlib lets go of the GIL)."""
    if threads <= 1:
        return {name: tensor_sha256(t) for name, t in state.items()}

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


def _ints(t: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU tensor's elements as flat integers of their size (no copy)."""
    return _bytes(t).view(_INTS[t.element_size()])


def _gap_dtype(numel: int) -> torch.dtype:
    return torch.int32 if numel < 2**31 else torch.int64


def _shuffle(a: torch.Tensor) -> torch.Tensor:
    """The bytes of a flat tensor by byte plane: every element's first byte, then every second...
    (numpy's transposing copy: 3-4x torch's for these shapes)."""
    import numpy as np

    planes = a.numpy().view(np.uint8).reshape(a.numel(), a.element_size()).T
    return torch.from_numpy(np.ascontiguousarray(planes).reshape(-1))


def _unshuffle(buf: torch.Tensor, n: int, dtype: torch.dtype) -> torch.Tensor:
    import numpy as np

    return torch.from_numpy(np.ascontiguousarray(buf.numpy().reshape(dtype.itemsize, n).T).reshape(-1)).view(dtype)


def _xor_payload(prev: torch.Tensor, new: torch.Tensor, sparse: bool,
                 scratch: torch.Tensor | None = None) -> tuple[torch.Tensor, str, int | None]:
    """(payload, op, nnz) of `new` from `prev`: with `sparse`, and at most `SPARSE_MAX_DENSITY` of
    its elements changed (counted first: a dense tensor costs no search for its changes), the
    shuffled gaps then the shuffled XORs of its changed elements ("sparse_xor"); else the XOR of
    every byte ("xor"). The XOR is written into `scratch` (uint8, flat) when it is large enough: a
    buffer reused from tensor to tensor costs no fresh pages (new memory is written 3-4x slower
    here), and the payload may then be a view of it."""
    if not sparse or new.element_size() not in _INTS or not new.numel():
        return _xor(prev, new), "xor", None
    nbytes = new.numel() * new.element_size()
    out = scratch[:nbytes].view(_INTS[new.element_size()]) if scratch is not None and scratch.numel() >= nbytes else None
    x = torch.bitwise_xor(_ints(prev), _ints(new), out=out)
    if int(torch.count_nonzero(x)) > SPARSE_MAX_DENSITY * new.numel():
        return x.view(torch.uint8), "xor", None
    pos = torch.nonzero(x).view(-1)
    values = x[pos]
    del x
    gaps = torch.diff(pos, prepend=pos.new_full((1,), -1)).to(_gap_dtype(new.numel()))
    return torch.cat([_shuffle(gaps), _shuffle(values)]), "sparse_xor", pos.numel()


def _apply_sparse_xor(prev: torch.Tensor, gaps: torch.Tensor, values: torch.Tensor, name: str) -> torch.Tensor:
    """A copy of `prev` with the elements at the gaps' running sum XORed with `values`."""
    out = prev.contiguous().clone()
    if not gaps.numel():
        return out
    if int(gaps.min()) < 1:
        raise CorruptVersionError(f"delta tensor {name}: a gap below 1 in its sparse indices")
    pos = torch.cumsum(gaps, 0, dtype=torch.int64) - 1
    if int(pos[-1]) >= out.numel():
        raise CorruptVersionError(f"delta tensor {name}: a sparse index past its {out.numel()} elements")
    flat = _ints(out)
    flat[pos] ^= values
    return out


def _zstd():
    import zstandard

    return zstandard


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise CorruptVersionError(f"unknown dtype {name!r} in a delta's index")
    return dtype


def _file_name(part: int) -> str:
    return f"delta-{part:05d}{DELTA_SUFFIX}"


def _share_out(new: dict[str, torch.Tensor], parts: int) -> dict[str, int]:
    """Each tensor's part: the largest first, each to the part holding the fewest bytes so far."""
    load, part_of = [0] * parts, {}
    for name in sorted(new, key=lambda k: -new[k].numel() * new[k].element_size()):
        part = min(range(parts), key=load.__getitem__)
        part_of[name] = part
        load[part] += new[name].numel() * new[name].element_size()
    return part_of


def encode_delta(prev: dict[str, torch.Tensor], new: dict[str, torch.Tensor], out_dir: Path,
                 parts: int = DELTA_PARTS, keep: bool = False, sparse: bool = True,
                 scratch: list[torch.Tensor] | None = None) -> tuple[list[Path], list[dict]]:
    """Write the delta from `prev` to `new` (both `canonical`) as up to `parts` zstd streams, one
    thread each: per tensor, in the order of the index returned, its changed elements as a sparse
    XOR from `prev`'s (`"op": "sparse_xor"`, with `sparse` and few enough changed), else its bytes XOR
    `prev`'s (`"op": "xor"`), or its own bytes when `prev` has no tensor of that name, dtype and
    shape (`"op": "full"`), and the xxh3_128 of `new`'s tensor. Streamed a tensor at a time: no copy of the whole
    state is made. With `keep`, each of `prev`'s tensors that XORed is overwritten with `new`'s
    once encoded (the caller's next `prev`, without allocating a copy). `scratch`: the caller's list
    of one XOR buffer per stream, kept from call to call (grown here to the stream's largest tensor:
    host memory of up to `parts` times the largest tensor). Returns (files, index)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    part_of = _share_out(new, max(1, min(parts, len(new))))
    index = [{"name": name, "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
              "op": "full", "file": _file_name(part_of[name])} for name, t in new.items()]
    for entry in index:
        p, t = prev.get(entry["name"]), new[entry["name"]]
        if p is not None and p.dtype == t.dtype and p.shape == t.shape:
            entry["op"] = "xor"

    def write(part: int, file: str) -> Path:
        path = out_dir / file
        cctx = _zstd().ZstdCompressor(level=ZSTD_LEVEL)
        buf = None
        if scratch is not None and sparse:
            need = max((new[e["name"]].numel() * new[e["name"]].element_size()
                        for e in index if e["file"] == file and e["op"] == "xor"), default=0)
            if scratch[part].numel() < need:
                scratch[part] = torch.empty(need, dtype=torch.uint8)
            buf = scratch[part]
        with open(path, "wb") as fh, cctx.stream_writer(fh, closefd=False) as writer:
            for entry in index:
                if entry["file"] != file:
                    continue
                name = entry["name"]
                t = new[name]
                if entry["op"] == "xor":
                    payload, entry["op"], nnz = _xor_payload(prev[name], t, sparse, buf)
                    if nnz is not None:
                        entry["nnz"] = nnz
                else:
                    payload = _bytes(t)
                writer.write(payload.numpy().data)
                entry["xxh3_128"] = tensor_xxh3(t)
                if keep and entry["op"] != "full":
                    prev[name].copy_(t)
        return path

    files = sorted({entry["file"] for entry in index})
    if scratch is not None:
        scratch.extend(torch.empty(0, dtype=torch.uint8) for _ in range(len(files) - len(scratch)))
    with ThreadPoolExecutor(len(files) or 1) as pool:
        paths = list(pool.map(write, range(len(files)), files))
    return paths, index


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
    """The state a delta's streams make of `prev` (new tensors; `prev` is left as it was), every
    stream read by a thread of its own. An index entry without `file` is in the one stream of a
    delta written before there were several."""
    by_name = {p.name: p for p in files}
    entries: dict[str, list[dict]] = {}
    for entry in index:
        file = entry.get("file", _file_name(0))
        if file not in by_name:
            raise CorruptVersionError(f"delta tensor {entry.get('name')} is in {file!r}, which the version does not have")
        entries.setdefault(file, []).append(entry)

    def read(file: str) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        with open(by_name[file], "rb") as fh, _zstd().ZstdDecompressor().stream_reader(fh) as reader:
            for entry in entries[file]:
                name, dtype, shape = entry["name"], _dtype(entry["dtype"]), tuple(entry["shape"])
                numel = 1
                for d in shape:
                    numel *= d
                size = dtype.itemsize
                op = entry["op"]
                if op not in ("full", "xor", "sparse_xor"):
                    raise CorruptVersionError(f"delta tensor {name}: unknown op {op!r}")
                if op != "full":
                    p = prev.get(name)
                    if p is None or p.dtype != dtype or tuple(p.shape) != shape:
                        raise CorruptVersionError(f"delta tensor {name} does not fit the previous version's")
                if op == "sparse_xor":
                    nnz = entry.get("nnz")
                    if not isinstance(nnz, int) or not 0 <= nnz <= numel or size not in _INTS:
                        raise CorruptVersionError(f"delta tensor {name}: nnz {nnz!r} for {numel} elements")
                    gap = _gap_dtype(numel)
                    gaps = _unshuffle(_read_exact(reader, nnz * gap.itemsize), nnz, gap)
                    values = _unshuffle(_read_exact(reader, nnz * size), nnz, _INTS[size])
                    out[name] = _apply_sparse_xor(p, gaps, values, name)
                else:
                    buf = _read_exact(reader, numel * size)
                    if op == "xor":
                        torch.bitwise_xor(buf, _bytes(p.contiguous()), out=buf)
                    out[name] = buf.view(dtype).reshape(shape) if numel else torch.empty(shape, dtype=dtype)
                if "xxh3_128" in entry and tensor_xxh3(out[name]) != entry["xxh3_128"]:
                    raise CorruptVersionError(f"reconstructed {name} does not match its checksum")
            if reader.read(1):
                raise CorruptVersionError(f"{file}: bytes after the last tensor of the delta's index")
        return out

    with ThreadPoolExecutor(max(1, len(entries))) as pool:
        parts = list(pool.map(read, entries))
    state = {}
    for part in parts:
        state.update(part)
    return {entry["name"]: state[entry["name"]] for entry in index}


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
        self._scratch: list[torch.Tensor] = []  # encode_delta's XOR buffers, one per stream
        self._spare: dict[str, torch.Tensor] | None = None  # a base replaced by an owned version
        self._spare_lock = threading.Lock()

    def take_spare(self) -> dict[str, torch.Tensor] | None:
        """The tensors of a version this publisher no longer needs (the base an `owned` version
        replaced), for the caller to copy its next version into instead of allocating (fresh host
        memory is written 3-4x slower than memory written before); None when
        there is none. Thread-safe: the trainer takes it while the publisher thread publishes."""
        with self._spare_lock:
            spare, self._spare = self._spare, None
        return spare

    def _retire(self, old: dict[str, torch.Tensor] | None, new: dict[str, torch.Tensor]) -> None:
        ptrs = {t.data_ptr() for t in new.values()}
        if old is not None and not any(t.data_ptr() in ptrs for t in old.values()):
            with self._spare_lock:
                self._spare = old

    def wants_full(self, version: int) -> bool:
        return (self.prev is None or self.prev_version != version - 1 or self.snapshot is None
                or version - self.snapshot >= self.full_every)

    def publish(self, store: WeightStore, model: str, version: int, state_dict: dict[str, torch.Tensor],
                meta: dict | None = None, owned: bool = False) -> Manifest:
        """Version `version` of `state_dict`, as a delta from the last one published when its chain
        allows. `owned`: the caller hands `state_dict` over (nobody changes it after: the trainer's
        CPU copy), and it becomes the base of the next delta as it is; otherwise the publisher's
        own copy is brought up to it in place, tensor by tensor as the delta is encoded."""
        from streamrft.engine.shards import publish_state_dict

        new = canonical(state_dict)
        meta = dict(meta or {})
        try:
            if self.wants_full(version):
                manifest = publish_state_dict(store, model, version, new,
                                              meta={**meta, "full_every": self.full_every},
                                              max_shard_bytes=self.max_shard_bytes)
                self.snapshot = version
                if owned:
                    self._retire(self.prev, new)
                    self.prev = new
                elif self.prev is not None and _same_layout(self.prev, new):
                    for name, t in new.items():
                        self.prev[name].copy_(t)
                else:
                    self.prev = {k: t.clone() for k, t in new.items()}
            else:
                tmp = Path(tempfile.mkdtemp(prefix=f"delta-v{version}-"))
                try:
                    files, index = encode_delta(self.prev, new, tmp, keep=not owned, scratch=self._scratch)
                    if owned:
                        self._retire(self.prev, new)
                        self.prev = new
                    else:  # tensors stored whole are new or reshaped: copies of their own
                        self.prev = {e["name"]: self.prev[e["name"]] if e["op"] != "full" else new[e["name"]].clone()
                                     for e in index}
                    meta.update(delta_from=self.prev_version, snapshot=self.snapshot, full_every=self.full_every,
                                tensors=index, full_tensors=[e["name"] for e in index if e["op"] == "full"])
                    manifest = store.publish_version(model, version, files, meta)
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
        except BaseException:
            # the copy may be half brought up to this version: the next attempt publishes in full
            self.prev = self.prev_version = None
            raise
        self.prev_version = version
        return manifest


def _same_layout(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and a[k].shape == b[k].shape for k in a)


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
        try:  # decode_delta checks every tensor's xxh3_128
            state = decode_delta(prev, files, meta["tensors"])
        except CorruptVersionError as e:
            raise CorruptVersionError(f"{model} v{version}: {e}") from None
        if all("xxh3_128" in e for e in meta["tensors"]):
            return state
        if "tensor_sha256" not in meta:
            raise CorruptVersionError(f"{model} v{version}: a delta without its tensors' checksums")
        expect = meta["tensor_sha256"]  # a delta written before xxh3_128
        if set(state) != set(expect):
            odd = sorted(set(state) ^ set(expect))[:5]
            raise CorruptVersionError(f"{model} v{version}: reconstructed tensors {odd} differ from the manifest's")
        for name, digest in state_sha256(state).items():
            if digest != expect[name]:
                raise CorruptVersionError(f"{model} v{version}: reconstructed {name} does not match its checksum")
        return state
    finally:
        shutil.rmtree(dest, ignore_errors=True)


def fetch_chain(store: WeightStore, model: str, version: int, cache_dir: Path,
                have: tuple[int, dict[str, torch.Tensor]] | None = None) -> tuple[dict[str, torch.Tensor], dict]:
    """(state dict, manifest meta) of `version`, full or delta. A delta is applied onto `have` =
    (its version, its state) when `have` lies on the chain (the deltas since replayed); when that
    fails, or without `have`, the chain is replayed from its full snapshot. Raises what the
    snapshot's chain fails with (CorruptVersionError, S3Error...)."""
    from streamrft.engine.shards import fetch_full_state_dict

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
