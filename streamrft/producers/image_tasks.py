"""Visual tasks drawn with PIL, for a small vision-language model to learn on the CPU.

Three kinds, each a question about a small seeded picture with one short answer, scored by the
`exact_match` reward:
- `count`: "how many shapes?" — 1 to 4 filled circles and squares, apart from each other; answer "3".
- `largest`: "which colour is largest?" — 2 or 3 shapes of different colours and sizes, the largest
  covering at least 1.3x the pixels of any other; answer "red".
- `digit`: "which digit?" — one digit 0-9 drawn in PIL's built-in font; answer "7".

Train and eval are split by a stable hash of the picture's pixels (`split_of`), so the held-out
set never shows a training picture, whatever the seeds. `make_image_tasks` writes each picture
as a PNG file beside the task rows, which name it (`image: <file>`), as a task file does.
"""
from __future__ import annotations

import hashlib
import random
from collections import Counter
from pathlib import Path

KINDS = ("count", "largest", "digit")
PROMPTS = {"count": "how many shapes?", "largest": "which colour is largest?", "digit": "which digit?"}
COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 70, 220)}
DECOYS = {"count": "1", "largest": "red", "digit": "1"}
"""A warm-up's wrong habit (`decoy_answers`): the one answer of each kind it teaches for any picture."""
EVAL_BUCKETS = 10
"""One picture in EVAL_BUCKETS (by the sha256 of its pixels) belongs to the eval split."""
ALPHABET = "".join(sorted(set("".join(PROMPTS.values()) + "".join(COLOURS) + "0123456789")))
"""Every character a prompt or answer can hold: a char tokenizer's vocabulary for these tasks."""


def split_of(pixels: bytes) -> str:
    return "eval" if int(hashlib.sha256(pixels).hexdigest()[:8], 16) % EVAL_BUCKETS == 0 else "train"


def _shape(draw, kind: str, box: tuple[int, int, int, int], fill) -> None:
    (draw.ellipse if kind == "circle" else draw.rectangle)(box, fill=fill)


def _apart(rng: random.Random, size: int, sides: list[int], tries: int = 200) -> list[tuple[int, int, int, int]] | None:
    """Boxes of the given sides placed without overlap (a gap of 1 pixel), or None."""
    boxes: list[tuple[int, int, int, int]] = []
    for side in sides:
        for _ in range(tries):
            x, y = rng.randrange(0, size - side + 1), rng.randrange(0, size - side + 1)
            box = (x, y, x + side - 1, y + side - 1)
            if all(box[2] + 1 < b[0] or b[2] + 1 < box[0] or box[3] + 1 < b[1] or b[3] + 1 < box[1] for b in boxes):
                boxes.append(box)
                break
        else:
            return None
    return boxes


def draw_task(kind: str, rng: random.Random, size: int = 32):
    """(image, answer) of one task of `kind`, drawn from `rng`."""
    from PIL import Image, ImageDraw, ImageFont

    im = Image.new("RGB", (size, size), (255, 255, 255))
    draw = ImageDraw.Draw(im)
    if kind == "count":
        while True:
            n = rng.randint(1, 4)
            boxes = _apart(rng, size, [rng.randint(size // 8, size // 4) for _ in range(n)])
            if boxes:
                break
        for box in boxes:
            _shape(draw, rng.choice(("circle", "square")), box, COLOURS[rng.choice(list(COLOURS))])
        return im, str(n)
    if kind == "largest":
        while True:  # until one colour covers at least 1.3x the pixels of any other
            im = Image.new("RGB", (size, size), (255, 255, 255))
            draw = ImageDraw.Draw(im)
            names = rng.sample(list(COLOURS), rng.randint(2, 3))
            boxes = _apart(rng, size, rng.sample(range(size // 8, size // 2), len(names)))
            if not boxes:
                continue
            for name, box in zip(names, boxes):
                _shape(draw, rng.choice(("circle", "square")), box, COLOURS[name])
            pixels = Counter(zip(*[iter(im.tobytes())] * 3))  # (r, g, b) -> how many
            area = sorted(((pixels[COLOURS[n]], n) for n in names), reverse=True)
            if area[0][0] >= 1.3 * area[1][0]:
                return im, area[0][1]
    if kind == "digit":
        digit = rng.randrange(10)
        font = ImageFont.load_default(size=int(size * 0.8))
        left, top, right, bottom = draw.textbbox((0, 0), str(digit), font=font)
        dx = rng.randint(0, max(size - (right - left), 0)) - left
        dy = rng.randint(0, max(size - (bottom - top), 0)) - top
        draw.text((dx, dy), str(digit), fill=(0, 0, 0), font=font)
        return im, str(digit)
    raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")


def draw_tasks(n: int, kinds: tuple[str, ...] = KINDS, seed: int = 0, split: str = "train", size: int = 32):
    """`n` tasks of `split` as (row `{"task_id", "prompt", "answer", "metadata"}`, picture, the sha256 of
    its pixels). Kinds take turns. Deterministic in (n, kinds, seed, split, size)."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', not {split!r}")
    for k in kinds:
        if k not in KINDS:
            raise ValueError(f"kinds: {k!r} is not one of {', '.join(KINDS)}")
    rng = random.Random(f"{seed}:{split}")
    made = 0
    while made < n:
        kind = kinds[made % len(kinds)]
        im, answer = draw_task(kind, rng, size)
        pixels = im.tobytes()
        if split_of(pixels) != split:
            continue
        yield ({"task_id": f"{kind}-{split}-{made}", "prompt": PROMPTS[kind], "answer": answer, "metadata": {"kind": kind}},
               im, hashlib.sha256(pixels).hexdigest())
        made += 1


def decoy_answers(rows: list[dict], frac: float, seed: int = 0) -> list[dict]:
    """`rows` with `frac` of their answers (drawn with `seed`) replaced by their kind's decoy (`DECOYS`):
    warm-up data that teaches a habit, answering "1" whatever the count, so that the warmed-up
    policy's greedy answer is often wrong while the right one keeps a fair probability for RL to
    find and reinforce, as the CPU demo's cut answers do for reversal."""
    if not 0.0 <= frac <= 1.0:
        raise ValueError(f"decoy_frac must be in [0, 1], not {frac}")
    rng = random.Random(seed)
    return [{**r, "answer": DECOYS[r["metadata"]["kind"]]} if rng.random() < frac else r for r in rows]


def make_image_tasks(n: int, out_dir: str | Path, kinds: tuple[str, ...] = KINDS, seed: int = 0,
                     split: str = "train", size: int = 32) -> list[dict]:
    """`draw_tasks` as task-file rows, each picture written to `out_dir/<sha256 of its pixels>.png`
    (the row's `image` names the file)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    for row, im, digest in draw_tasks(n, tuple(kinds), seed, split, size):
        path = out / f"{digest}.png"
        if not path.exists():
            im.save(path, format="PNG")
        rows.append({**row, "image": path.name})
    return rows
