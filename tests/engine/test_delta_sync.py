"""Delta weight versions (`engine.delta`) in the real S3 store (session stack): bit-exact round trips
along a chain with full snapshots, the explorers' watcher falling back from a corrupt delta or a
drifted local copy, GC keeping the snapshot a kept chain needs, the config's check, and the trainer
publishing deltas."""
from __future__ import annotations

import io
import logging
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from streamrft.config import ConfigError  # noqa: E402
from streamrft.engine.delta import DeltaPublisher, canonical  # noqa: E402
from streamrft.engine.models import build_char_tokenizer, build_tiny_model  # noqa: E402
from streamrft.engine.weights import fetch_state_dict  # noqa: E402
from streamrft.infra.kafka import ensure_topics, flush_or_raise, make_producer, run_topics  # noqa: E402
from streamrft.infra.objectstore import CorruptVersionError, WeightStore  # noqa: E402
from streamrft.schemas import WeightVersion, encode, topic_name  # noqa: E402
from tests_helpers import wait_for


@pytest.fixture
def store(stack) -> WeightStore:
    store = WeightStore(stack.s3)
    store.ensure_bucket()
    return store


def _versions(tmp_path: Path, n: int) -> list[dict[str, torch.Tensor]]:
    """`n` successive bf16 states of a tiny Qwen2 (tied head), each a few elements away from the
    one before, as a small optimiser step leaves them; v2 also grows a tensor (stored whole)."""
    model = build_tiny_model(tmp_path / "base", build_char_tokenizer("abc "), hidden_size=16, layers=1, heads=2,
                             seed=0).to(torch.bfloat16)
    gen = torch.Generator().manual_seed(0)
    states, state = [], canonical(model.state_dict())
    for v in range(n):
        if v:
            state = {k: t.clone() for k, t in state.items()}
            for t in state.values():
                flat = t.view(-1)
                idx = torch.randint(0, flat.numel(), (max(1, flat.numel() // 50),), generator=gen)
                flat[idx] += 1e-2
        if v == 2:
            state["extra.weight"] = torch.randn(4, 4, generator=gen).to(torch.bfloat16)
        states.append(state)
    return states


def _equal(a: dict, b: dict) -> bool:
    return set(a) == set(b) and all(a[k].dtype == b[k].dtype and torch.equal(a[k].view(-1).view(torch.uint8),
                                                                              b[k].view(-1).view(torch.uint8))
                                    for k in a)


def _publish_all(store, key, states, full_every=3, keep=None):
    pub = DeltaPublisher(full_every)
    manifests = []
    for v, state in enumerate(states):
        manifests.append(pub.publish(store, key, v, state, meta={"step": v, "kind": "full"}))
        if keep is not None:
            store.gc(key, keep)
    return manifests


def test_round_trip_of_five_versions_is_bit_exact(store, namespace, tmp_path):
    key = f"{namespace}/policy"
    states = _versions(tmp_path, 5)
    manifests = _publish_all(store, key, states, full_every=3)
    metas = [m.meta for m in manifests]
    assert [m.get("delta_from") for m in metas] == [None, 0, 1, None, 3]
    assert [m.get("snapshot") for m in metas] == [None, 0, 0, None, 3]
    assert metas[2]["full_tensors"] == ["extra.weight"] and metas[4]["full_tensors"] == []
    full_bytes = sum(f["size"] for f in manifests[0].files.values())
    assert all(sum(f["size"] for f in manifests[v].files.values()) < full_bytes / 2 for v in (1, 2, 4))
    have = None
    for v, state in enumerate(states):
        cold, meta = fetch_state_dict(store, key, v, tmp_path / "cache")  # from the chain's snapshot
        assert _equal(cold, state), v
        assert meta["step"] == v
        warm, _ = fetch_state_dict(store, key, v, tmp_path / "cache", have)  # onto the previous version
        assert _equal(warm, state), v
        have = (v, warm)
    # a reader that is two versions behind replays both deltas from its own copy
    two, _ = fetch_state_dict(store, key, 2, tmp_path / "cache", (0, states[0]))
    assert _equal(two, states[2])


def test_a_publisher_fed_live_tensors_keeps_its_own_base(store, namespace, tmp_path):
    """Without `owned`, the caller's tensors change in place between versions (as a live model's):
    the publisher's base is its own copy, brought up to each version as the delta is encoded, and
    every version reads back bit-exact; a delta holds two streams, each tensor's xxh3_128 in the index."""
    key = f"{namespace}/policy"
    states = _versions(tmp_path, 4)
    live = {k: t.clone() for k, t in states[0].items()}
    pub = DeltaPublisher(10)
    for v, state in enumerate(states):
        if v:
            for name, t in state.items():
                if name in live and live[name].shape == t.shape:
                    live[name].copy_(t)
                else:
                    live[name] = t.clone()
        manifest = pub.publish(store, key, v, live, meta={"kind": "full"})
        assert not any(p.data_ptr() == t.data_ptr() for p in pub.prev.values() for t in live.values())
        if v:
            assert sorted(manifest.files) == ["delta-00000.st.zst", "delta-00001.st.zst"]
            assert all(len(e["xxh3_128"]) == 32 for e in manifest.meta["tensors"])
    for v, state in enumerate(states):
        assert _equal(fetch_state_dict(store, key, v, tmp_path / "cache")[0], state), v


def test_a_failed_publish_makes_the_next_attempt_full(stack, store, namespace, tmp_path):
    """Publishing v1 fails in S3 after its delta was encoded (the publisher's base is half way to
    v1): the retry of v1 is a full snapshot, v2 a delta from it again, all bit-exact."""
    from streamrft.config import S3Config

    key = f"{namespace}/policy"
    states = _versions(tmp_path, 3)
    missing = WeightStore(S3Config(**{**stack.s3.model_dump(), "bucket": f"missing-{namespace}".lower()[:60]}))
    for owned in (False, True):
        k = f"{key}-{owned}"
        pub = DeltaPublisher(10)
        pub.publish(store, k, 0, {n: t.clone() for n, t in states[0].items()}, owned=owned)
        with pytest.raises(Exception):
            pub.publish(missing, k, 1, {n: t.clone() for n, t in states[1].items()}, owned=owned)
        retry = pub.publish(store, k, 1, {n: t.clone() for n, t in states[1].items()}, owned=owned)
        assert "delta_from" not in retry.meta
        assert pub.publish(store, k, 2, {n: t.clone() for n, t in states[2].items()}, owned=owned
                           ).meta["delta_from"] == 1
        for v in (1, 2):
            assert _equal(fetch_state_dict(store, k, v, tmp_path / "cache")[0], states[v]), (owned, v)


def test_a_delta_written_before_xxh3_still_reads(store, namespace, tmp_path):
    """A delta of the first format (one stream, no `file` in its index, `tensor_sha256` in its meta)
    still applies, and its sha256 still catches a wrong reconstruction."""
    from streamrft.engine.delta import encode_delta, state_sha256

    key = f"{namespace}/policy"
    states = _versions(tmp_path, 2)
    DeltaPublisher(10).publish(store, key, 0, states[0])
    files, index = encode_delta(states[0], states[1], tmp_path / "old", parts=1)
    index = [{k: v for k, v in e.items() if k not in ("file", "xxh3_128")} for e in index]
    meta = {"kind": "full", "delta_from": 0, "snapshot": 0, "full_every": 10, "tensors": index, "full_tensors": [],
            "tensor_sha256": state_sha256(states[1])}
    store.publish_version(key, 1, files, meta)
    assert _equal(fetch_state_dict(store, key, 1, tmp_path / "cache")[0], states[1])
    bad = f"{namespace}/bad"
    DeltaPublisher(10).publish(store, bad, 0, states[0])
    wrong = dict(meta["tensor_sha256"])
    wrong[next(iter(wrong))] = "0" * 64
    store.publish_version(bad, 1, files, {**meta, "tensor_sha256": wrong})
    with pytest.raises(CorruptVersionError, match="does not match its checksum"):
        fetch_state_dict(store, bad, 1, tmp_path / "cache")


def test_a_drifted_local_copy_falls_back_to_the_snapshot(store, namespace, tmp_path, caplog):
    key = f"{namespace}/policy"
    states = _versions(tmp_path, 3)
    _publish_all(store, key, states, full_every=3)
    drifted = {k: t.clone() for k, t in states[1].items()}
    next(iter(drifted.values())).view(-1)[0] += 1  # one element of the explorer's copy is wrong
    with caplog.at_level(logging.WARNING, logger="streamrft.engine.delta"):
        got, _ = fetch_state_dict(store, key, 2, tmp_path / "cache", (1, drifted))
    assert _equal(got, states[2])
    assert "does not match its checksum" in caplog.text and "replaying from the full snapshot v0" in caplog.text


def _corrupt(store, name: str) -> None:
    resp = store.client.get_object(store.bucket, name)
    good = resp.read()
    resp.close()
    resp.release_conn()
    bad = good[:-8] + bytes(b ^ 0xFF for b in good[-8:])
    store.client.put_object(store.bucket, name, io.BytesIO(bad), len(bad))


def _announce(kafka, namespace: str, store: WeightStore, key: str, version: int) -> None:
    wv = WeightVersion(model="policy", version=version, bucket=store.bucket, prefix=store.prefix(key, version))
    producer = make_producer(kafka)
    producer.produce(topic_name(namespace, "weights"), key=b"policy", value=encode(wv))
    flush_or_raise(producer)




def test_the_watcher_gets_past_a_corrupt_delta_bit_exact(stack, store, namespace, tmp_path):
    """v1's delta object is corrupt in S3: v1 and v2 cannot be built from anything (the watcher keeps
    retrying, never hands out a wrong state), v3 is the next full snapshot, and v4 is applied onto it."""
    from streamrft.producers.weights_watcher import WeightsWatcher

    ensure_topics(stack.kafka, run_topics(stack.kafka, namespace))
    key = f"{namespace}/policy"
    states = _versions(tmp_path, 5)
    manifests = _publish_all(store, key, states, full_every=3)
    _corrupt(store, f"{key}/v1/{next(iter(manifests[1].files))}")
    # nothing builds v2 either: its chain goes through v1
    with pytest.raises(CorruptVersionError):
        fetch_state_dict(store, key, 2, tmp_path / "cache")

    watcher = WeightsWatcher(stack.kafka, namespace, store, "policy", key, tmp_path / "watch", current_version=-1)
    watcher.retry_max_s = 0.5
    watcher.start()
    try:
        _announce(stack.kafka, namespace, store, key, 0)
        v, state, lora = wait_for(watcher.take, 30, "v0")
        assert v == 0 and lora is None and _equal(state, states[0])
        _announce(stack.kafka, namespace, store, key, 1)
        wait_for(lambda: watcher.fetch_errors >= 2, 30, "failed fetches of v1")
        _announce(stack.kafka, namespace, store, key, 2)
        wait_for(lambda: watcher.fetch_errors >= 4, 30, "failed fetches of v2")
        assert watcher.take() is None
        _announce(stack.kafka, namespace, store, key, 3)
        v, state, _ = wait_for(watcher.take, 30, "v3, a full snapshot")
        assert v == 3 and _equal(state, states[3])
        _announce(stack.kafka, namespace, store, key, 4)
        v, state, _ = wait_for(watcher.take, 30, "v4, a delta onto v3")
        assert v == 4 and _equal(state, states[4])
        errors = watcher.fetch_errors
    finally:
        watcher.stop()
    assert watcher._have[0] == 4 and errors >= 4


def test_gc_keeps_the_snapshot_a_kept_chain_needs(store, namespace, tmp_path):
    key = f"{namespace}/policy"
    states = _versions(tmp_path, 6)
    pub = DeltaPublisher(3)
    kept = []
    for v, state in enumerate(states):
        pub.publish(store, key, v, state, meta={"kind": "full"})
        store.gc(key, keep=2)
        kept.append(store.list_versions(key))
    # v2 keeps its snapshot v0 and the delta v1 (also while v2 itself is kept after v3);
    # v3 is full, so v4 and v5 need v3 alone
    assert kept == [[0], [0, 1], [0, 1, 2], [0, 1, 2, 3], [3, 4], [3, 4, 5]]
    for v in (3, 4, 5):
        assert _equal(fetch_state_dict(store, key, v, tmp_path / "cache")[0], states[v])
    # a full-only history GCs as before
    plain = f"{namespace}/plain"
    pub = DeltaPublisher(1)
    for v, state in enumerate(states[:4]):
        pub.publish(store, plain, v, state)
    assert store.gc(plain, keep=1) == [0, 1, 2] and store.list_versions(plain) == [3]


def test_config_checks_full_every(tmp_path):
    from streamrft.config import load_config

    path = tmp_path / "run.yaml"
    path.write_text("namespace: demo\nmodel: {name: policy, path: out/models/tiny}\ndata: {train: t.jsonl}\n"
                    "trainer: {weight_sync: {delta: true, full_every: 0}}\n")
    with pytest.raises(ConfigError, match=r"trainer\.weight_sync\.full_every: must be >= 1 \(got 0\)"):
        load_config(path)
    with pytest.raises(ConfigError, match=r"trainer\.weight_sync\.delat"):
        load_config(path, ["trainer.weight_sync.full_every=5", "trainer.weight_sync.delat=true"])
    cfg = load_config(path, ["trainer.weight_sync.full_every=5"])
    assert cfg.trainer.weight_sync.delta and cfg.trainer.weight_sync.full_every == 5
    assert not load_config(path, ["trainer.weight_sync.full_every=5", "trainer.weight_sync.delta=false"]
                           ).trainer.weight_sync.delta


def test_the_publishers_retired_base_takes_the_next_copy(store, namespace, tmp_path):
    """An owned delta makes the base it replaced the spare; `cpu_copy(into=spare)` fills those
    very tensors (no fresh memory) and keeps a tied pair tied; the spare is never the current base,
    and every version reads back from S3 as it was published."""
    from streamrft.consumers.publisher import cpu_copy

    key = f"{namespace}/policy"
    published = []

    def emb_ptr(state):
        return state["emb.weight"].data_ptr()

    emb = torch.randn(6, 4)
    live = {"emb.weight": emb, "head.weight": emb, "b": torch.zeros(4)}  # a tied head
    pub = DeltaPublisher(full_every=10)
    assert pub.take_spare() is None
    v0 = cpu_copy(live)
    published.append(pub.publish(store, key, 0, v0, owned=True).meta)  # full: no base before it
    assert pub.take_spare() is None
    live["b"] += 1
    v1 = cpu_copy(live)
    published.append(pub.publish(store, key, 1, v1, owned=True).meta)
    spare = pub.take_spare()
    assert pub.take_spare() is None
    assert {k: t.data_ptr() for k, t in spare.items()} == {"emb.weight": emb_ptr(v0), "b": v0["b"].data_ptr()}
    assert all(p.data_ptr() == v1[k].data_ptr() for k, p in pub.prev.items())
    live["b"] += 1
    v2 = cpu_copy(live, into=spare)
    assert v2["emb.weight"].data_ptr() == v0["emb.weight"].data_ptr() == v2["head.weight"].data_ptr()
    assert v2["b"].data_ptr() == v0["b"].data_ptr() and torch.equal(v2["b"], torch.full((4,), 2.0))
    published.append(pub.publish(store, key, 2, v2, owned=True).meta)
    assert [m.get("delta_from") for m in published] == [None, 0, 1]
    assert {k: t.data_ptr() for k, t in pub.take_spare().items()} == {"emb.weight": emb_ptr(v1), "b": v1["b"].data_ptr()}
    for v in (0, 1, 2):  # v0's tensors now hold v2: what S3 has of each version is unchanged
        state, _ = fetch_state_dict(store, key, v, tmp_path / "cache")
        assert torch.equal(state["b"], torch.full((4,), float(v))) and torch.equal(state["emb.weight"], emb), v
    # a spare of another shape is not written into
    other = cpu_copy({"b": torch.zeros(5)}, into=None)
    v3 = cpu_copy(live, into=other)
    assert v3["b"].data_ptr() != other["b"].data_ptr()
