"""The visual tasks: seeded, split by the picture's hash, and each answer true of its picture
(shapes counted as connected regions, the largest colour by its pixels)."""
from __future__ import annotations

import hashlib
import random

import numpy as np
import pytest
from PIL import Image

from streamrft.producers.image_tasks import COLOURS, KINDS, draw_task, make_image_tasks, split_of


def _regions(im: Image.Image) -> int:
    """Connected non-white regions (4-neighbours)."""
    w, h = im.size
    px = im.load()
    seen, n = set(), 0
    for x in range(w):
        for y in range(h):
            if px[x, y] == (255, 255, 255) or (x, y) in seen:
                continue
            n += 1
            todo = [(x, y)]
            while todo:
                a, b = todo.pop()
                if (a, b) in seen or not (0 <= a < w and 0 <= b < h) or px[a, b] == (255, 255, 255):
                    continue
                seen.add((a, b))
                todo += [(a + 1, b), (a - 1, b), (a, b + 1), (a, b - 1)]
    return n


def test_each_answer_is_true_of_its_picture():
    rng = random.Random(3)
    for _ in range(40):
        im, answer = draw_task("count", rng)
        assert _regions(im) == int(answer) and 1 <= int(answer) <= 4
        im, answer = draw_task("largest", rng)
        pixels = np.asarray(im).reshape(-1, 3)
        counts = {name: int((pixels == rgb).all(axis=1).sum()) for name, rgb in COLOURS.items()}
        assert answer == max(counts, key=counts.get)
        im, answer = draw_task("digit", rng)
        assert answer in "0123456789" and len(answer) == 1 and _regions(im) >= 1


def test_tasks_are_seeded_and_the_held_out_split_never_shows_a_training_picture(tmp_path):
    train = make_image_tasks(60, tmp_path / "train", seed=1)
    assert train == make_image_tasks(60, tmp_path / "again", seed=1)
    assert [r["metadata"]["kind"] for r in train[:3]] == list(KINDS)
    held_out = make_image_tasks(30, tmp_path / "eval", seed=1, split="eval")
    pixels = lambda d, r: Image.open(d / r["image"]).convert("RGB").tobytes()  # noqa: E731
    train_hashes = {hashlib.sha256(pixels(tmp_path / "train", r)).hexdigest() for r in train}
    eval_hashes = {hashlib.sha256(pixels(tmp_path / "eval", r)).hexdigest() for r in held_out}
    assert train_hashes.isdisjoint(eval_hashes)
    assert all(split_of(pixels(tmp_path / "eval", r)) == "eval" for r in held_out)
    assert {r["image"] for r in train} <= {p.name for p in (tmp_path / "train").iterdir()}
    with pytest.raises(ValueError, match="kinds: 'colour' is not one of count, largest, digit"):
        make_image_tasks(1, tmp_path, kinds=("colour",))


def test_decoy_answers_teach_one_answer_a_kind_to_the_fraction_drawn():
    import random

    import pytest

    from streamrft.producers.image_tasks import DECOYS, decoy_answers

    rows = [{"task_id": f"t{i}", "answer": "3", "metadata": {"kind": k}}
            for i, k in enumerate(["count", "largest", "digit"] * 20)]
    assert decoy_answers(rows, 0.0) == rows
    assert [r["answer"] for r in decoy_answers(rows, 1.0)] == [DECOYS[r["metadata"]["kind"]] for r in rows]
    rng = random.Random(7)  # the draws decoy_answers makes with seed 7, row by row
    want = [DECOYS[r["metadata"]["kind"]] if rng.random() < 0.4 else "3" for r in rows]
    got = decoy_answers(rows, 0.4, seed=7)
    assert [r["answer"] for r in got] == want and 0 < want.count("3") < len(rows)
    assert [r["task_id"] for r in got] == [r["task_id"] for r in rows] and rows[0]["answer"] == "3"  # a copy
    with pytest.raises(ValueError, match=r"decoy_frac must be in \[0, 1\], not 1.5"):
        decoy_answers(rows, 1.5)
