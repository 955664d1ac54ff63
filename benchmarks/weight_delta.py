"""Delta vs full weight versions after one AdamW step: bytes moved, and seconds from publish to an
explorer having swapped, next to a raw S3 put + get of the same bytes.

    .venv/bin/python benchmarks/weight_delta.py [--repeats 2] [--lr 1e-6]   # Qwen2.5-0.5B shape, bf16

A Qwen2 of Qwen2.5-0.5B's shape (494M parameters, tied head) is built locally with a random init
in bfloat16 and takes two real AdamW steps (lr 1e-6, on random batches; a fresh optimiser each, so
each is a first step), all in bf16 (about 5 GB of host memory at a step): v0, v1, v2. On a private
embedded stack (SeaweedFS S3 + Tansu), per repeat, a key of its own: v0 and v1 are published and
loaded by the explorer side untimed (as a trainer in its steady state: the delta publisher holds
its XOR buffers and the base v1 retired, which the next CPU copy is written into); then v2 is
published (a) whole (`publish_state_dict`) and (b) as a delta from v1 (`engine.delta.DeltaPublisher`:
the changed elements' sparse XOR + zstd in two parallel streams, each tensor's xxh3_128), each from
the trainer's own CPU copy of the weights (`cpu_copy` into the spare, timed), announced, and the
explorer's WeightsWatcher fetches, verifies (for the delta: applies onto its v1 and checks every
tensor's xxh3_128) and a TransformersEngine swaps it in. Raw: one `fput_object` + `fget_object` of
the same bytes (the safetensors file; the delta's files) with the minio SDK, nothing else.
"""
from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from streamrft.config import KafkaConfig, S3Config
from streamrft.consumers.publisher import cpu_copy
from streamrft.engine.delta import DeltaPublisher, canonical, encode_delta
from streamrft.engine.models import build_char_tokenizer
from streamrft.engine.rollout.hf import TransformersEngine
from streamrft.infra.kafka import ensure_topics, flush_or_raise, make_producer, run_topics
from streamrft.infra.objectstore import WeightStore, make_client
from streamrft.infra.stack import S3_KEY, EmbeddedStack, free_ports
from streamrft.producers.weights_watcher import WeightsWatcher
from streamrft.schemas import WeightVersion, encode, topic_name


def build_model(out_dir: Path):
    """Qwen2.5-0.5B's shape, random init, bf16, saved with a char tokenizer (the explorer loads it)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = build_char_tokenizer("abcdefgh")
    config = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=2048,
                         tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return model


def adamw_step(model, lr: float, tokens: int, seed: int = 1) -> float:
    """One AdamW step (defaults otherwise: weight decay 0.01) on a random batch; returns its seconds."""
    t0 = time.perf_counter()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    ids = torch.randint(0, model.config.vocab_size, (1, tokens), generator=torch.Generator().manual_seed(seed))
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    del opt
    model.eval()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        t0 = time.perf_counter()
        model = build_model(tmp / "model")
        v0 = {k: t.clone() for k, t in canonical(model.state_dict()).items()}
        n_params = sum(t.numel() for t in v0.values())
        nbytes = sum(t.numel() * t.element_size() for t in v0.values())
        print(f"model: {n_params / 1e6:.0f}M parameters (tied head stored once), bf16, {nbytes / 1e6:.0f} MB; "
              f"built in {time.perf_counter() - t0:.0f}s")
        states = [v0]
        for step in (1, 2):
            step_s = adamw_step(model, args.lr, args.tokens, seed=step)
            states.append({k: t.clone() for k, t in canonical(model.state_dict()).items()})
            changed = sum(int((_u16(states[-2][k]) != _u16(states[-1][k])).sum()) for k in v0)
            print(f"AdamW step {step} (lr {args.lr:g}, {args.tokens} tokens) in {step_s:.0f}s: "
                  f"{changed / n_params:.2%} of the bf16 elements changed")
        v1, v2 = states[1], states[2]

        es = EmbeddedStack(tmp / "stack", **free_ports())
        # a kill (timeout, Ctrl-C) still runs the `finally` below: the stack is stopped, never left behind
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        try:
            state = es.up()
            kafka = KafkaConfig(bootstrap=state.kafka)
            s3 = S3Config(endpoint=state.s3, access_key=S3_KEY, secret_key=S3_KEY)
            store = WeightStore(s3)
            store.ensure_bucket()
            client = make_client(s3)
            engine = TransformersEngine(str(tmp / "model"), dtype="bfloat16")
            producer = make_producer(kafka)

            def raw_put_get(files: list[Path]) -> float:
                t = time.perf_counter()
                for i, f in enumerate(files):
                    client.fput_object(s3.bucket, f"raw/{f.name}", str(f))
                    client.fget_object(s3.bucket, f"raw/{f.name}", str(tmp / f"raw-back-{i}"))
                return time.perf_counter() - t

            full_file = tmp / "full" / "model.safetensors"
            full_file.parent.mkdir()
            save_file(v2, str(full_file))
            delta_files, index = encode_delta(v1, v2, tmp / "delta")
            ops = [e["op"] for e in index]
            print(f"delta v1 -> v2: {ops.count('sparse_xor')} tensors sparse, {ops.count('xor')} dense, "
                  f"{ops.count('full')} whole")
            moved = {}
            raw = {"full": [], "delta": []}
            ours = {"full": [], "delta": []}
            for r in range(args.repeats):
                for mode in ("full", "delta"):
                    raw[mode].append(raw_put_get([full_file] if mode == "full" else delta_files))
                    ns = f"bench-{mode}-{r}"
                    ensure_topics(kafka, run_topics(kafka, ns))
                    watcher = WeightsWatcher(kafka, ns, store, "policy", ns, tmp / "cache", current_version=-1).start()
                    pub = DeltaPublisher(full_every=10 if mode == "delta" else 1)

                    def publish(v: int, weights: dict) -> None:
                        # as the trainer: its CPU copy of the version (into the base the last delta
                        # retired, when there is one), handed to the publisher
                        copy = cpu_copy(weights, into=pub.take_spare())
                        manifest = pub.publish(store, ns, v, copy, meta={"kind": "full"}, owned=True)
                        wv = WeightVersion(model="policy", version=v, bucket=s3.bucket, prefix=store.prefix(ns, v),
                                           manifest_sha256=manifest.sha256)
                        producer.produce(topic_name(ns, "weights"), key=b"policy", value=encode(wv))
                        flush_or_raise(producer)

                    def swapped(v: int) -> None:
                        while (ready := watcher.take()) is None:
                            time.sleep(0.005)
                        assert ready[0] == v
                        engine.load_weights(ready[1], ready[0], ready[2])

                    for v in (0, 1):  # untimed: the explorer's verified copy of v1, the publisher's buffers
                        publish(v, states[v])
                        swapped(v)
                    t = time.perf_counter()
                    publish(2, v2)
                    t_pub = time.perf_counter() - t
                    swapped(2)
                    ours[mode].append(time.perf_counter() - t)
                    watcher.stop()
                    moved[mode] = sum(f["size"] for f in store.read_manifest(ns, 2).files.values())
                    watcher = pub = None  # noqa: F841  (the publisher's copy of v0 goes)
                    print(f"{mode:5s} r{r}: raw put+get {raw[mode][-1]:6.2f}s | publish {t_pub:6.2f}s, "
                          f"publish->swapped {ours[mode][-1]:6.2f}s")
            # where a delta's seconds go, stage by stage, outside S3 (same code, same tensors)
            from streamrft.engine.delta import decode_delta, state_sha256, tensor_xxh3
            stages = {}

            def timed(what: str, fn):
                t = time.perf_counter()
                out = fn()
                stages[what] = time.perf_counter() - t
                return out

            spare = cpu_copy(v0)
            timed("trainer: CPU copy into a spare", lambda: cpu_copy(v1, into=spare))
            scratch = []
            encode_delta(v1, v2, tmp / "delta2", scratch=scratch)  # the publisher's XOR buffers, as in steady state
            files, index = timed("trainer: sparse xor + zstd + xxh3 (2 streams)",
                                 lambda: encode_delta(v1, v2, tmp / "delta3", scratch=scratch))
            rebuilt = timed("explorer: unzstd + xor + xxh3", lambda: decode_delta(v1, files, index))
            timed("explorer: engine swap", lambda: engine.load_weights(rebuilt, 2))
            files, index = timed("for scale, the dense format (every byte's XOR): encode",
                                 lambda: encode_delta(v1, v2, tmp / "dense", sparse=False))
            timed("decode", lambda: decode_delta(v1, files, index))
            print(f"dense format: {sum(f.stat().st_size for f in files) / 1e6:.2f} MB")
            timed("for scale: xxh3_128 of every tensor", lambda: [tensor_xxh3(t) for t in v2.values()])
            timed("sha256 of every tensor (2 threads; the check before xxh3)", lambda: state_sha256(v2))
            spare = rebuilt = None  # noqa: F841
            print("delta stages: " + ", ".join(f"{k} {s:.2f}s" for k, s in stages.items()))
            # the engine holds v2 exactly
            own = canonical(engine.model.state_dict())
            assert all(torch.equal(_u16(own[k]), _u16(v2[k])) for k in v2)
            producer.flush(10)
            publish = producer = None  # before the broker stops, or librdkafka logs reconnect failures
            med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
            print(f"raw files: full {full_file.stat().st_size / 1e6:.1f} MB, "
                  f"delta {sum(f.stat().st_size for f in delta_files) / 1e6:.2f} MB")
            print(f"bytes moved per version: full {moved['full'] / 1e6:.1f} MB, delta {moved['delta'] / 1e6:.2f} MB "
                  f"-> delta {moved['full'] / moved['delta']:.1f}x smaller (target >= 20x)")
            for mode in ("full", "delta"):
                print(f"{mode:5s}: median raw S3 put+get {med(raw[mode]):.2f}s, "
                      f"publish->swapped {med(ours[mode]):.2f}s, "
                      f"ratio {med(ours[mode]) / med(raw[mode]):.2f} (target <= 1.3)")
            print(f"delta publish->swapped / full publish->swapped = {med(ours['delta']) / med(ours['full']):.2f}")
        finally:
            es.down()
            shutil.rmtree(tmp / "cache", ignore_errors=True)


def _u16(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(-1).view(torch.uint8)


if __name__ == "__main__":
    main()
