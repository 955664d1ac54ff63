"""Can the tiny VLM made here see? Supervised fine-tuning on the visual tasks, held-out greedy
accuracy per kind as it goes, on this machine's CPU.

    .venv/bin/python benchmarks/vlm_sft.py [--steps 1500] [--lr 5e-4] [--kinds count,largest,digit]

`engine/vlm.py`'s tiny LLaVA (random init, 32 x 32 images in 16 patches) is trained on image-answer
pairs of `producers/image_tasks.py` (3,000 train tasks; the loss on the answer and EOS only),
batches of 32, AdamW, gradient norm clipped at 1, and every `--every` steps greedy-decodes 50
held-out tasks of each kind (pictures never trained on, by pixel hash). Chance: count 0.25 (1-4),
largest 0.33-0.5, digit 0.1. It tells what a warm-up stage can give RL to start from.
"""
from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--every", type=int, default=150)
    ap.add_argument("--kinds", default="count,largest,digit")
    ap.add_argument("--decoy-steps", type=int, default=0,
                    help="then this many steps on pairs of which --decoy-frac answer their kind's decoy")
    ap.add_argument("--decoy-frac", type=float, default=0.6)
    a = ap.parse_args()

    import torch
    from PIL import Image

    from streamrft.engine.models import load_policy, load_processor
    from streamrft.engine.vlm import IMAGE_TOKEN, build_tiny_vlm
    from streamrft.producers.image_tasks import ALPHABET, decoy_answers, make_image_tasks

    torch.set_num_threads(2)
    kinds = tuple(a.kinds.split(","))
    with tempfile.TemporaryDirectory(prefix="vlm-sft-") as tmp:
        out = Path(tmp)
        build_tiny_vlm(out / "m", ALPHABET)
        model, tok = load_policy(out / "m")
        proc = load_processor(out / "m")
        train = make_image_tasks(3000, out / "train", kinds=kinds, seed=0)
        held_out = make_image_tasks(50 * len(kinds), out / "eval", kinds=kinds, seed=0, split="eval")

        def encode(rows, folder, answers=True):
            images = [Image.open(folder / r["image"]).convert("RGB") for r in rows]
            texts = [IMAGE_TOKEN + r["prompt"] + (r["answer"] + tok.eos_token if answers else "") for r in rows]
            return proc(text=texts, images=images, return_tensors="pt", padding=True)

        def accuracy() -> dict[str, float]:
            model.eval()
            got = {}
            with torch.no_grad():
                for k in kinds:
                    rows = [r for r in held_out if r["metadata"]["kind"] == k]
                    batch = encode(rows, out / "eval", answers=False)
                    ids = model.generate(**batch, max_new_tokens=7, do_sample=False)
                    texts = tok.batch_decode(ids[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
                    got[k] = sum(t.strip() == r["answer"] for t, r in zip(texts, rows)) / len(rows)
            model.train()
            return got

        opt = torch.optim.AdamW(model.parameters(), lr=a.lr)
        rng, t0 = random.Random(0), time.monotonic()
        model.train()
        print(f"step     0 accuracy {accuracy()}", flush=True)
        decoyed = decoy_answers(train, a.decoy_frac, seed=1)
        for step in range(1, a.steps + a.decoy_steps + 1):
            rows = rng.sample(train if step <= a.steps else decoyed, a.batch)
            batch = encode(rows, out / "train")
            labels = torch.full_like(batch["input_ids"], -100)
            for i, r in enumerate(rows):  # left-padded: the answer and EOS are each row's last tokens
                n = len(tok(r["answer"] + tok.eos_token, add_special_tokens=False)["input_ids"])
                labels[i, -n:] = batch["input_ids"][i, -n:]
            loss = model(**batch, labels=labels).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
            if step % a.every == 0 or step in (a.steps, a.steps + a.decoy_steps):
                acc = accuracy()
                print(f"step {step:5d} loss {loss.item():.3f} {time.monotonic() - t0:5.0f} s accuracy {acc} "
                      f"mean {sum(acc.values()) / len(acc):.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
