"""One training micro-step of a SmolLM2-135M-sized model on CPU: response-only log-probs vs the
full log-softmax, and float32 vs bfloat16, side by side in one run.

    .venv/bin/python benchmarks/cpu_train_step.py [--model DIR] [--batch 16] [--prompt 64] [--response 32]

Without `--model` it builds SmolLM2-135M-Instruct's architecture (LlamaForCausalLM, 30 layers,
hidden 576, 9 heads / 3 kv heads, vocabulary 49,152, tied embeddings) with random weights: speed
does not depend on the weights. Each setting runs in its own process: forward +
backward of the policy-gradient loss on BATCH sequences of PROMPT + RESPONSE tokens (median of 3
after a warm-up), its peak RSS, and the speed-up over the float32 full-vocabulary baseline; bf16
autocast keeps float32 weights (what an optimiser needs), bf16 weights do not. Also `generate`
(sampling RESPONSE new tokens, batch 8) with float32 and bfloat16 weights.
"""
from __future__ import annotations

import argparse
import resource
import statistics
import time

import torch

from streamrft.consumers.batch import Batch, token_logprobs
from streamrft.monitor.bars import bar


def smollm2_sized(dtype: torch.dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                      num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                      tie_word_embeddings=True, rope_theta=100000.0)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).to(dtype)


def load(model_dir: str | None, dtype: torch.dtype):
    if model_dir is None:
        return smollm2_sized(dtype)
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)


def make_batch(b: int, p: int, r: int, vocab: int) -> Batch:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, vocab, (b, p + r), generator=g)
    mask = torch.zeros(b, p + r - 1)
    mask[:, p - 1:] = 1.0
    return Batch(ids, torch.ones_like(ids), mask, torch.full((b, p + r - 1), -1.0) * mask,
                 torch.randn(b, generator=g), torch.zeros(b))


class FullVocab(torch.nn.Module):
    """The same model without `logits_to_keep`: logits and log-softmax at every position."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask)


def step_seconds(model, batch: Batch, autocast: bool, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logp, _ = token_logprobs(model, batch)
            loss = -(batch.advantages[:, None] * logp.float() * batch.mask).sum() / batch.mask.sum()
        loss.backward()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def generate_tok_s(model, r: int) -> float:
    ids = torch.randint(3, 1000, (8, 48), generator=torch.Generator().manual_seed(2))
    model.eval()
    with torch.no_grad():
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=True, pad_token_id=0)
        t0 = time.perf_counter()
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=r, min_new_tokens=r,
                       do_sample=True, pad_token_id=0)
    return 8 * r / (time.perf_counter() - t0)


SETTINGS = {
    "fp32, full log-softmax": ("float32", "full", False),
    "fp32, response only": ("float32", "response", False),
    "bf16 autocast, response only": ("float32", "response", True),
    "bf16 weights, response only": ("bfloat16", "response", False),
    "generate fp32 (tok/s, batch 8)": ("float32", "generate", False),
    "generate bf16 (tok/s, batch 8)": ("bfloat16", "generate", False),
}


def measure(setting: str, args) -> tuple[float, float]:
    """In a fresh process (see main): the value and this process's peak RSS in MiB."""
    dtype, what, autocast = SETTINGS[setting]
    model = load(args.model, getattr(torch, dtype))
    if what == "generate":
        value = generate_tok_s(model, args.response)
    else:
        model.train()
        batch = make_batch(args.batch, args.prompt, args.response, model.config.vocab_size)
        value = step_seconds(FullVocab(model) if what == "full" else model, batch, autocast)
    return value, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    import multiprocessing as mp

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--response", type=int, default=32)
    args = ap.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; batch {args.batch} x "
          f"({args.prompt} prompt + {args.response} response) tokens; each line in its own process")
    ctx = mp.get_context("spawn")
    results = {}
    with bar(len(SETTINGS), "settings", unit="setting") as progress:
        for setting in SETTINGS:
            progress.set_postfix_str(setting)
            with ctx.Pool(1) as pool:
                results[setting] = pool.apply(measure, (setting, args))
            progress.update(1)
    base = results["fp32, full log-softmax"][0]
    print(f"{'setting':<34}{'value':>10}{'vs fp32 full':>14}{'peak RSS MiB':>14}")
    for setting, (v, rss) in results.items():
        gen = setting.startswith("generate")
        print(f"{setting:<34}{(f'{v:.1f}' if gen else f'{v:.2f} s'):>10}{('' if gen else f'{base / v:.2f}x'):>14}{rss:>14.0f}")


if __name__ == "__main__":
    main()
