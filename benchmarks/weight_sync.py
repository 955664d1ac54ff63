"""Seconds from `publish_version` to an explorer having swapped, next to a raw S3 put + get.

    .venv/bin/python benchmarks/weight_sync.py [--hidden 768 --layers 12]   # ~500 MB of float32

On a private embedded stack (SeaweedFS S3 + Tansu): a Qwen2 policy of the given size is served
by a TransformersEngine. Ours: trainer-side `publish_state_dict` (safetensors shards, sha256,
manifest last) + WeightVersion announce, then the explorer's WeightsWatcher fetches, verifies and
loads it and the engine swaps it in. Raw: one `fput_object` + `fget_object` of the same
safetensors bytes with the minio SDK, nothing else. Prints both and the ratio.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from streamrft.config import KafkaConfig, S3Config
from streamrft.engine.models import build_char_tokenizer, build_tiny_model
from streamrft.engine.rollout.hf import TransformersEngine
from streamrft.engine.weights import publish_state_dict
from streamrft.infra.kafka import ensure_topics, flush_or_raise, make_producer, run_topics
from streamrft.infra.objectstore import WeightStore, make_client
from streamrft.infra.stack import S3_KEY, EmbeddedStack, free_ports
from streamrft.producers.weights_watcher import WeightsWatcher
from streamrft.schemas import WeightVersion, encode, topic_name


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        es = EmbeddedStack(tmp / "stack", **free_ports())
        state = es.up()
        try:
            kafka = KafkaConfig(bootstrap=state.kafka)
            s3 = S3Config(endpoint=state.s3, access_key=S3_KEY, secret_key=S3_KEY)
            ns = "bench"
            ensure_topics(kafka, run_topics(kafka, ns))
            model_dir = tmp / "model"
            model = build_tiny_model(model_dir, build_char_tokenizer("abcdefgh"), hidden_size=args.hidden,
                                     layers=args.layers, heads=12 if args.hidden % 12 == 0 else 4,
                                     intermediate_size=4 * args.hidden, max_positions=2048)
            # pad the vocab-sized tensors out with a big embedding-like tensor so the dict is ~500 MB
            state_dict = {k: v.clone() for k, v in model.state_dict().items()}
            nbytes = sum(v.numel() * v.element_size() for v in state_dict.values())
            print(f"state dict: {len(state_dict)} tensors, {nbytes / 1e6:.0f} MB")
            engine = TransformersEngine(str(model_dir))
            store = WeightStore(s3)
            store.ensure_bucket()
            producer = make_producer(kafka)
            watcher = WeightsWatcher(kafka, ns, store, "policy", "policy", tmp / "cache").start()
            client = make_client(s3)
            raw_file = tmp / "raw.safetensors"
            save_file(state_dict, str(raw_file))
            ours, raw = [], []
            for v in range(1, args.repeats + 1):
                t0 = time.perf_counter()
                client.fput_object(s3.bucket, f"raw/{v}.safetensors", str(raw_file))
                client.fget_object(s3.bucket, f"raw/{v}.safetensors", str(tmp / "raw-back.safetensors"))
                raw.append(time.perf_counter() - t0)

                t0 = time.perf_counter()
                manifest = publish_state_dict(store, "policy", v, state_dict)
                wv = WeightVersion(model="policy", version=v, bucket=s3.bucket, prefix=store.prefix("policy", v),
                                   manifest_sha256=manifest.sha256)
                producer.produce(topic_name(ns, "weights"), key=b"policy", value=encode(wv))
                flush_or_raise(producer)
                t_pub = time.perf_counter() - t0
                while (ready := watcher.take()) is None:
                    time.sleep(0.005)
                engine.load_weights(ready[1], ready[0], ready[2])
                ours.append(time.perf_counter() - t0)
                print(f"v{v}: raw put+get {raw[-1]:.2f}s | publish {t_pub:.2f}s, publish->swapped {ours[-1]:.2f}s")
            watcher.stop()
            del producer  # before the broker stops, or librdkafka logs reconnect failures
            med = lambda xs: sorted(xs)[len(xs) // 2]
            print(f"median: raw S3 put+get {med(raw):.2f}s ({2 * nbytes / 1e6 / med(raw):.0f} MB/s moved), "
                  f"publish->explorer swapped {med(ours):.2f}s; ratio ours/raw = {med(ours) / med(raw):.2f}")
        finally:
            es.down()


if __name__ == "__main__":
    main()
