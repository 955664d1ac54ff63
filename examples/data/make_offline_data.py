"""Write the offline examples' datasets for the demo's reverse-string task (deterministic).

Run from the repo root: `python examples/data/make_offline_data.py`. It rewrites
`prefs.jsonl` (DPO pairs: chosen = the correct reversal, rejected = a wrong one), `kto.jsonl`
(one completion per prompt, alternately correct and wrong, labelled) and `sft.jsonl`.
"""
from __future__ import annotations

import random
from pathlib import Path

from streamrft.producers.synthetic import LETTERS, make_demo_tasks, write_jsonl

HERE = Path(__file__).resolve().parent
N = 48
SEED = 0


def wrong_answer(word: str, rng: random.Random) -> str:
    """A plausible mistake: the word unreversed, two letters swapped, or one letter changed."""
    answer = word[::-1]
    while True:
        kind = rng.choice(("copy", "swap", "change"))
        chars = list(answer)
        if kind == "copy":
            chars = list(word)
        elif kind == "swap":
            i = rng.randrange(len(chars) - 1)
            chars[i], chars[i + 1] = chars[i + 1], chars[i]
        else:
            i = rng.randrange(len(chars))
            chars[i] = rng.choice([c for c in LETTERS if c != chars[i]])
        wrong = "".join(chars)
        if wrong != answer:  # a palindrome copied or equal letters swapped is no mistake
            return wrong


def main() -> None:
    rng = random.Random(SEED)
    tasks = make_demo_tasks(N, seed=SEED, split="train")
    prefs, kto, sft = [], [], []
    for i, t in enumerate(tasks):
        word = t["answer"][::-1]
        wrong = wrong_answer(word, rng)
        prefs.append({"prompt": t["prompt"], "chosen": t["answer"], "rejected": wrong})
        good = i % 2 == 0
        kto.append({"prompt": t["prompt"], "completion": t["answer"] if good else wrong, "label": good})
        sft.append({"prompt": t["prompt"], "completion": t["answer"]})
    for name, rows in (("prefs", prefs), ("kto", kto), ("sft", sft)):
        print(write_jsonl(rows, HERE / f"{name}.jsonl"))


if __name__ == "__main__":
    main()
