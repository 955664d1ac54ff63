"""Bytes the trainer's forward keeps for backward, per token: the activation figure of a GPU memory plan.

Counts what autograd saves (`torch.autograd.graph.saved_tensors_hooks`, each storage once, the
weights left out) while `consumers.batch.token_logprobs` runs a randomly initialised Qwen2 of the
given widths in bfloat16, as the trainer does. Models of 1 and 2 decoder layers give the bytes per
layer per token; what the 1-layer model keeps beyond one layer is the output side (the float32
log-softmax over the vocabulary, per scored token). Runs on the CPU in about a minute with the
defaults (Qwen2.5-1.5B's widths): saved activations do not depend on the device, only the
attention kernel's own small state does (SDPA here and on CUDA).

    python benchmarks/trainer_activation_memory.py [--hidden 1536 --intermediate 8960 --vocab 151936 ...] [--checkpointing]

Measured (Qwen2.5-1.5B widths, 2 x 384 tokens, 2 x 256 scored): 103,480 B per layer per token;
625,060 B per scored token on the output side (4 x vocab = 607,744 of it). examples/gsm8k_gpu.yaml's
memory plan uses these. At Qwen2.5-VL-3B's language model widths (`--hidden 2048 --intermediate 11008
--heads 16 --kv-heads 2`): 130,120 B per layer per token, 630,696 B per scored token; with
`--checkpointing`, the per-layer figure below, which examples/vlm_gpu.yaml's plan uses.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def saved_bytes(layers: int, args, rows: int, length: int, prompt: int) -> int:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from streamrft.consumers.batch import Batch, token_logprobs

    cfg = Qwen2Config(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
                      num_hidden_layers=layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                      tie_word_embeddings=True, max_position_embeddings=4096)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).to(torch.bfloat16).train()
    if args.checkpointing:
        from streamrft.engine.training import enable_checkpointing

        enable_checkpointing(model.eval())  # as the trainer runs it: eval mode, its layers checkpointed
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    ids = torch.randint(0, args.vocab, (rows, length))
    mask = torch.zeros(rows, length - 1)
    mask[:, prompt - 1:] = 1
    batch = Batch(ids, torch.ones(rows, length, dtype=torch.long), mask, torch.zeros(rows, length - 1),
                  torch.ones(rows), torch.ones(rows), torch.ones(rows))
    kept: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights:
            kept[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logp, _ = token_logprobs(model, batch)
        (logp * batch.mask).sum().backward()
    return sum(kept.values())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=1536)
    p.add_argument("--intermediate", type=int, default=8960)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--rows", type=int, default=2)
    p.add_argument("--length", type=int, default=384)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--checkpointing", action="store_true",
                   help="trainer.gradient_checkpointing: what stays saved is each layer's input (backward then "
                        "recomputes one layer at a time, whose saved tensors are the figure without this flag)")
    args = p.parse_args()
    one, two = (saved_bytes(n, args, args.rows, args.length, args.prompt) for n in (1, 2))
    tokens, scored = args.rows * args.length, args.rows * (args.length - args.prompt)
    per_layer = (two - one) / tokens
    output_side = (one - (two - one)) / scored
    print(f"{tokens} tokens, {scored} scored: saved {one / 2**20:.1f} MiB (1 layer), {two / 2**20:.1f} MiB (2 layers)")
    print(f"per layer per token: {per_layer:,.0f} B; output side per scored token: {output_side:,.0f} B "
          f"({output_side / args.vocab:.2f} x vocab)")


if __name__ == "__main__":
    main()
