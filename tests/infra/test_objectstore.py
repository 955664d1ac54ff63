"""Weight versions in the real S3 server: publish/fetch, verification, GC (session stack); retries
across an S3 restart, by the publisher and by the explorers' weights watcher (a private stack)."""
from __future__ import annotations

import io
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from streamrft.infra.kafka import ensure_topics, flush_or_raise, make_producer, run_topics
from streamrft.infra.objectstore import MANIFEST, CorruptVersionError, WeightStore
from streamrft.schemas import WeightVersion, encode, topic_name
from tests_helpers import wait_for


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


def test_gc_of_versions_the_caller_tracks_lists_only_what_it_deletes(store, namespace, tmp_path, monkeypatch):
    """A listing of the model's prefix slows as deleted versions pile up in the store: given the
    versions, gc lists each deleted version's own objects and nothing else."""
    shards = _shards(_tiny_module(0), tmp_path / "src")
    for version in range(1, 6):
        store.publish_version(namespace, version, shards)
    listed, real = [], store._list
    monkeypatch.setattr(store, "_list", lambda prefix: listed.append(prefix) or real(prefix))
    assert store.gc(namespace, keep=2, versions=[5, 3, 4, 2, 1]) == [1, 2, 3]
    assert listed == [f"{namespace}/v{v}/" for v in (1, 2, 3)]
    monkeypatch.undo()
    assert store.list_versions(namespace) == [4, 5]
    store.fetch_version(namespace, 4, tmp_path / "dst")


# ---- riding out S3 restarts ---------------------------------------------------------------------


def _announce(kafka, namespace: str, store: WeightStore, key: str, version: int) -> None:
    wv = WeightVersion(model="policy", version=version, bucket=store.bucket, prefix=store.prefix(key, version))
    producer = make_producer(kafka)
    producer.produce(topic_name(namespace, "weights"), key=b"policy", value=encode(wv))
    flush_or_raise(producer)


def _same_weights(got: dict, module: torch.nn.Module) -> bool:
    expected = module.state_dict()
    return set(got) == set(expected) and all(torch.equal(got[k], expected[k]) for k in expected)


def test_transient_errors_are_told_from_permanent_ones():
    from minio.error import S3Error, ServerError
    from urllib3.exceptions import MaxRetryError, NewConnectionError

    from streamrft.infra.objectstore import is_transient

    refused = NewConnectionError(None, "Connection refused")
    assert is_transient(MaxRetryError(None, "/weights/x", refused)) and is_transient(ConnectionResetError())
    assert is_transient(TimeoutError()) and is_transient(ServerError("bad gateway", 502))
    assert is_transient(S3Error(None, "SlowDown", "", "", "", ""))
    assert not is_transient(S3Error(None, "NoSuchKey", "", "", "", ""))
    assert not is_transient(CorruptVersionError("x")) and not is_transient(ValueError())


def test_a_store_that_stays_down_fails_loudly_after_its_retry_budget():
    from streamrft.config import S3Config
    from streamrft.infra.objectstore import StoreUnavailableError
    from streamrft.infra.stack import free_ports

    down = S3Config(endpoint=f"127.0.0.1:{free_ports()['s3_port']}", bucket="weights")
    store = WeightStore(down, retry_s=2.0)
    t0 = time.monotonic()
    with pytest.raises(StoreUnavailableError, match=r"list policy/ failed \d+ time\(s\) in \d+s \(retry budget 2s\)"):
        store.list_versions("policy")
    assert time.monotonic() - t0 < 20


def test_a_store_that_accepts_and_never_answers_is_retried_within_seconds():
    """A half-open S3 (it accepts the connection, then never answers) held one upload for the
    client's 120 s read timeout, and the error then said "kept failing for 60s" about that one try.
    Now each try gives up after `s3.timeout_s`, and the retry budget spans several tries."""
    import socket

    from streamrft.config import S3Config
    from streamrft.infra.objectstore import StoreUnavailableError

    server = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def accept():
        while True:
            try:
                accepted.append(server.accept()[0])  # and never a byte back
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    try:
        silent = S3Config(endpoint=f"127.0.0.1:{server.getsockname()[1]}", bucket="weights", timeout_s=1.0)
        store = WeightStore(silent, retry_s=4.0)
        t0 = time.monotonic()
        with pytest.raises(StoreUnavailableError) as info:
            store.list_versions("policy")
        took = time.monotonic() - t0
    finally:
        server.close()
        for conn in accepted:
            conn.close()
    tries = int(info.value.args[0].split(" failed ")[1].split(" ")[0])
    assert tries >= 3 and len(accepted) >= tries, (info.value, len(accepted))
    assert took < 4.0 + 2 * 1.0 + 1.0  # the budget, at most one try past it, and slack


def test_watcher_retries_a_version_it_could_not_fetch(stack, store, namespace, tmp_path):
    """A corrupt object today meant the version was skipped for good: with max_staleness 0 the
    explorers then waited forever. Now the watcher asks again until it gets it."""
    from streamrft.engine.weights import publish_state_dict
    from streamrft.producers.weights_watcher import WeightsWatcher

    ensure_topics(stack.kafka, run_topics(stack.kafka, namespace))
    key = f"{namespace}/policy"
    module = _tiny_module(3)
    manifest = publish_state_dict(store, key, 1, module.state_dict())
    shard = f"{key}/v1/{next(iter(manifest.files))}"
    resp = store.client.get_object(store.bucket, shard)
    good = resp.read()
    resp.close()
    resp.release_conn()
    bad = good[:-8] + bytes(b ^ 0xFF for b in good[-8:])
    store.client.put_object(store.bucket, shard, io.BytesIO(bad), len(bad))

    watcher = WeightsWatcher(stack.kafka, namespace, store, "policy", key, tmp_path / "cache").start()
    try:
        _announce(stack.kafka, namespace, store, key, 1)
        wait_for(lambda: watcher.fetch_errors >= 2, 30, "two failed fetches", every=0.1)
        assert watcher.latest_announced == 1 and watcher.take() is None
        store.client.put_object(store.bucket, shard, io.BytesIO(good), len(good))
        version, state, lora = wait_for(watcher.take, 30, "the repaired version", every=0.1)
    finally:
        watcher.stop()
    assert version == 1 and _same_weights(state, module) and lora is None  # a manifest without `kind`: full


def test_publish_and_the_watcher_ride_out_an_s3_restart(private_stack, tmp_path):
    from streamrft.engine.weights import publish_state_dict
    from streamrft.producers.weights_watcher import WeightsWatcher

    kafka, es, ns = private_stack.kafka, private_stack.embedded, "s3-restart"
    ensure_topics(kafka, run_topics(kafka, ns))
    store = WeightStore(private_stack.s3)
    store.ensure_bucket()
    key = f"{ns}/policy"
    module = _tiny_module(4)
    watcher = WeightsWatcher(kafka, ns, store, "policy", key, tmp_path / "cache").start()
    try:
        # announced before it is in S3: the watcher keeps asking for it while S3 goes away
        _announce(kafka, ns, store, key, 1)
        wait_for(lambda: watcher.fetch_errors >= 1, 30, "a failed fetch", every=0.1)
        es.kill("weed")  # SIGKILL
        outcome: dict = {}

        def publish():
            try:
                outcome["manifest"] = publish_state_dict(store, key, 1, module.state_dict())
            except Exception as e:  # reported by the assertion below
                outcome["error"] = e

        publisher = threading.Thread(target=publish)
        publisher.start()
        time.sleep(3)
        assert publisher.is_alive(), f"publish_version did not wait for S3: {outcome}"
        errors_while_down = watcher.fetch_errors
        es.restart("weed")
        publisher.join(90)
        assert "manifest" in outcome, outcome
        version, state, _ = wait_for(watcher.take, 90, "the version published across the restart", every=0.1)
    finally:
        watcher.stop()
    assert version == 1 and _same_weights(state, module)
    assert watcher.fetch_errors >= errors_while_down >= 1
    assert store.list_versions(key) == [1]
