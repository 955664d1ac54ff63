"""The bytes of a delta version (`engine.delta.encode_delta` / `decode_delta`), without S3: which
tensors go sparse, the sparse layout worked out by hand, round trips of every element size, the
checks a corrupt sparse entry fails, and the XOR scratch reused from call to call (the publisher's
retired base, which the trainer copies its next version into, is in test_delta_sync.py: real S3)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
zstandard = pytest.importorskip("zstandard")

from streamrft.engine.delta import SPARSE_MAX_DENSITY, decode_delta, encode_delta  # noqa: E402
from streamrft.infra.objectstore import CorruptVersionError  # noqa: E402


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.reshape(-1).view(torch.uint8),
                                                                     b.reshape(-1).view(torch.uint8))


def _stream(path) -> bytes:
    with open(path, "rb") as fh:
        return zstandard.ZstdDecompressor().stream_reader(fh).read()


def test_the_sparse_layout_by_hand(tmp_path):
    """int16 elements 1 and 4 of 20 change (XOR 0x0102 and 0x0300): gaps 2, 3 (int32, from index
    -1), XORs 0x0102, 0x0300, each array byte-plane shuffled, little-endian."""
    prev = torch.arange(5, 25, dtype=torch.int16)
    new = prev.clone()
    new[1] ^= 0x0102
    new[4] ^= 0x0300
    files, index = encode_delta({"w": prev}, {"w": new}, tmp_path, parts=1)
    assert index[0]["op"] == "sparse_xor" and index[0]["nnz"] == 2
    gaps = bytes([2, 3, 0, 0, 0, 0, 0, 0])  # low bytes of 2 and 3, then three planes of zeros
    xors = bytes([0x02, 0x00, 0x01, 0x03])  # low bytes of 0x0102 and 0x0300, then their high bytes
    assert _stream(files[0]) == gaps + xors
    assert _same(decode_delta({"w": prev}, files, index)["w"], new)


def test_dense_tensors_stay_dense_and_sparse_false_writes_the_old_format(tmp_path):
    """More than SPARSE_MAX_DENSITY of the elements changed: every byte's XOR ("xor"), as a delta
    written before the sparse format, which still decodes; so does `sparse=False` throughout."""
    gen = torch.Generator().manual_seed(0)
    prev = {"few": torch.randn(1000, generator=gen), "many": torch.randn(1000, generator=gen)}
    new = {k: t.clone() for k, t in prev.items()}
    new["few"][:int(1000 * SPARSE_MAX_DENSITY)] += 1.0  # exactly at the limit: still sparse
    new["many"][:int(1000 * SPARSE_MAX_DENSITY) + 1] += 1.0
    files, index = encode_delta(prev, new, tmp_path / "a", parts=1)
    ops = {e["name"]: e["op"] for e in index}
    assert ops == {"few": "sparse_xor", "many": "xor"}
    dense_bytes = (prev["many"].view(torch.int32) ^ new["many"].view(torch.int32)).numpy().tobytes()
    assert dense_bytes in _stream(files[0])
    out = decode_delta(prev, files, index)
    assert all(_same(out[k], new[k]) for k in new)
    files, index = encode_delta(prev, new, tmp_path / "b", parts=1, sparse=False)
    assert {e["op"] for e in index} == {"xor"} and not any("nnz" in e for e in index)
    out = decode_delta(prev, files, index)
    assert all(_same(out[k], new[k]) for k in new)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.int64,
                                   torch.uint8, torch.bool])
def test_round_trip_of_every_element_size(tmp_path, dtype):
    gen = torch.Generator().manual_seed(1)
    base = torch.randn(3, 700, generator=gen)
    prev = {"w": (base > 0) if dtype == torch.bool else (base * 50).to(dtype), "scalar": torch.tensor(3.0),
            "empty": torch.zeros(0, 4), "same": torch.arange(10.0), "grown": torch.ones(2)}
    new = {k: t.clone() for k, t in prev.items()}
    flat = new["w"].view(-1)
    idx = torch.randperm(flat.numel(), generator=gen)[:40]
    flat[idx] = ~flat[idx] if dtype == torch.bool else flat[idx] + 1
    flat[0] = ~flat[0] if dtype == torch.bool else flat[0] + 1  # the first element: a gap of 1
    flat[-1] = ~flat[-1] if dtype == torch.bool else flat[-1] + 1  # the last one
    new["scalar"] = torch.tensor(4.0)
    new["grown"] = torch.ones(3)  # another shape: stored whole
    files, index = encode_delta(prev, new, tmp_path)
    ops = {e["name"]: e["op"] for e in index}
    assert ops["w"] == "sparse_xor" and ops["grown"] == "full" and ops["same"] == "sparse_xor"
    assert {e["name"]: e.get("nnz") for e in index}["same"] == 0
    out = decode_delta(prev, files, index)
    assert list(out) == list(new) and all(_same(out[k], new[k]) for k in new)
    assert _same(prev["w"], prev["w"].clone())  # decode left the reader's copy as it was


def _corrupt(index: list[dict], **change) -> list[dict]:
    return [{**e, **change} if e["op"] == "sparse_xor" else e for e in index]


def test_a_corrupt_sparse_entry_fails_as_corrupt(tmp_path):
    prev = {"w": torch.zeros(100, dtype=torch.bfloat16)}
    new = {"w": prev["w"].clone()}
    new["w"][[3, 50, 99]] = 1.0
    files, index = encode_delta(prev, new, tmp_path)
    for bad, match in (({"nnz": 101}, "nnz"), ({"nnz": -1}, "nnz"), ({"nnz": "3"}, "nnz"),
                       ({"nnz": 2}, "past its 100 elements|bytes after the last tensor"), ({"nnz": 4}, "ended"),
                       ({"op": "scatter"}, "unknown op")):
        with pytest.raises(CorruptVersionError, match=match):
            decode_delta(prev, files, _corrupt(index, **bad))
    # gaps that run past the tensor, or a gap of 0: rewritten by hand into a stream of their own
    for gaps in ([4, 47, 60], [4, 0, 50]):
        raw = torch.tensor(gaps, dtype=torch.int32).view(torch.uint8).view(3, 4).t().contiguous().view(-1)
        vals = torch.ones(3, dtype=torch.int16).view(torch.uint8).view(3, 2).t().contiguous().view(-1)
        path = tmp_path / files[0].name
        path.write_bytes(zstandard.ZstdCompressor().compress(raw.numpy().tobytes() + vals.numpy().tobytes()))
        one = [{**index[0], "file": path.name}]
        with pytest.raises(CorruptVersionError, match="past its 100 elements|gap below 1"):
            decode_delta(prev, [path], one)


def test_the_scratch_is_kept_and_changes_no_byte(tmp_path):
    """The publisher's XOR buffers: grown once to each stream's largest tensor, then reused; the
    streams are the same bytes as without them."""
    gen = torch.Generator().manual_seed(2)
    prev = {f"t{i}": torch.randn(n, generator=gen).to(torch.bfloat16) for i, n in enumerate((5000, 3000, 800, 700))}
    new = {k: t.clone() for k, t in prev.items()}
    for t in new.values():
        t.view(-1)[::37] += 0.5
    plain, index = encode_delta(prev, new, tmp_path / "plain")
    scratch: list[torch.Tensor] = []
    first, _ = encode_delta(prev, new, tmp_path / "s1", scratch=scratch)
    assert sorted(s.numel() for s in scratch) == [3000 * 2 + 0, 5000 * 2]  # streams: {t0}, {t1, t2, t3}
    ptrs = [s.data_ptr() for s in scratch]
    second, index2 = encode_delta(prev, new, tmp_path / "s2", scratch=scratch)
    assert [s.data_ptr() for s in scratch] == ptrs
    for a, b, c in zip(plain, first, second):
        assert a.read_bytes() == b.read_bytes() == c.read_bytes()
    assert index == index2
