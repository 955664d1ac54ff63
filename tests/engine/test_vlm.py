"""The tiny vision-language model made here: saved with its processor, loaded as any hub VLM,
its image placeholders counted, and its output depending on the picture."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForImageTextToText, AutoProcessor

from streamrft.engine.vlm import IMAGE_TOKEN, build_tiny_vlm, image_positions
from streamrft.producers.image_tasks import ALPHABET, draw_task


def _logprobs(model, inputs, target: torch.Tensor) -> torch.Tensor:
    ids = torch.cat([inputs["input_ids"], target[None]], dim=1)
    mask = torch.ones_like(ids)
    logits = model(input_ids=ids, attention_mask=mask, pixel_values=inputs["pixel_values"]).logits
    logp = torch.log_softmax(logits[0, :-1].float(), dim=-1)
    n = target.numel()
    return logp[-n:].gather(1, ids[0, -n:, None])[:, 0]


def test_a_tiny_vlm_loads_as_any_hub_vlm_and_sees_its_image(tmp_path):
    import random

    build_tiny_vlm(tmp_path / "vlm", ALPHABET, image_size=32, patch_size=8)
    processor = AutoProcessor.from_pretrained(tmp_path / "vlm")
    model = AutoModelForImageTextToText.from_pretrained(tmp_path / "vlm").eval()
    assert type(model).__name__ == "LlavaForConditionalGeneration"
    rng = random.Random(0)
    red, _ = draw_task("largest", rng)
    other, _ = draw_task("count", rng)
    inputs = processor(text=[f"{IMAGE_TOKEN}which colour is largest?"], images=[red], return_tensors="pt")
    image_id = processor.tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    positions = image_positions(inputs["input_ids"], image_id)
    assert int(positions.sum()) == (32 // 8) ** 2  # one placeholder per patch, CLIP's class token dropped
    assert inputs["pixel_values"].shape == (1, 3, 32, 32)
    target = torch.tensor(processor.tokenizer("red", add_special_tokens=False)["input_ids"])
    with torch.no_grad():
        a = _logprobs(model, inputs, target)
        again = _logprobs(model, inputs, target)
        swapped = _logprobs(model, {**inputs, "pixel_values": processor(text=[IMAGE_TOKEN], images=[other],
                                                                        return_tensors="pt")["pixel_values"]}, target)
        out = model.generate(**inputs, max_new_tokens=3, do_sample=False)
    assert torch.equal(a, again)  # the same pixels, the same log-probs
    assert not torch.allclose(a, swapped)  # another picture, other log-probs: the model sees it
    assert out.shape[1] == inputs["input_ids"].shape[1] + 3


def test_an_image_pair_is_laid_out_as_explorers_prompt_and_trains_only_the_answer(tmp_path):
    from PIL import Image

    from streamrft.engine.sft import _batch, _pixels, image_pair_sequence
    from streamrft.engine.vlm import image_prompt_ids, pixel_values

    _, proc = build_tiny_vlm(tmp_path / "m", ALPHABET)
    im = Image.new("RGB", (32, 32), (255, 0, 0))
    ids, mask, pixels = image_pair_sequence(proc, "which digit?", "7", [im])
    prompt = image_prompt_ids(proc, "which digit?", [im])  # what an explorer rolls out from
    tok = proc.tokenizer
    assert ids[: len(prompt)] == prompt
    assert ids[len(prompt):] == [tok.convert_tokens_to_ids("7"), tok.eos_token_id]
    assert mask == [0] * len(prompt) + [1, 1]
    assert prompt.count(proc.image_token_id) == 16  # (32 / 8)^2 placeholders, never trained
    assert torch.equal(pixels, pixel_values(proc, [im]))
    # a batch of a text row and two image rows: the pixels in row order, the labels only the answers
    text_ids = tok("abc").input_ids + [tok.eos_token_id]
    text = (text_ids, [0] * (len(text_ids) - 2) + [1, 1])
    blue = image_pair_sequence(proc, "which digit?", "1", [Image.new("RGB", (32, 32), (0, 0, 255))])
    seqs = [(ids, mask, pixels), text, blue]
    assert torch.equal(_pixels(seqs), torch.cat([pixels, blue[2]]))
    _, _, labels = _batch(tok, seqs)
    assert (labels[0] != -100).sum() == 2 and (labels[1] != -100).sum() == 2


_FROZEN_STEP = r"""
import sys, torch
from PIL import Image
from streamrft.config import TrainerConfig
from streamrft.engine.sft import image_pair_sequence
from streamrft.engine.training import make_train_engine
from streamrft.engine.vlm import build_tiny_vlm
from streamrft.producers.image_tasks import ALPHABET

engine_type, out = sys.argv[1], sys.argv[2]
model, proc = build_tiny_vlm(out, ALPHABET)
before = {k: v.detach().clone() for k, v in model.state_dict().items()}
cfg = TrainerConfig(engine=engine_type, lr=0.01, freeze_vision_tower=True,
                    **({"deepspeed": {"zero_stage": 2, "num_gpus": 1}} if engine_type == "deepspeed" else {}))
engine = make_train_engine(cfg, model)
ids, mask, pixels = image_pair_sequence(proc, "which digit?", "7", [Image.new("RGB", (32, 32), (255, 0, 0))])
x = torch.tensor([ids])
logits = engine.model(input_ids=x, pixel_values=pixels).logits[0, :-1]
loss = -(torch.log_softmax(logits, -1).gather(1, x[0, 1:, None])[:, 0] * torch.tensor(mask[1:])).sum()
engine.backward(loss)
engine.step()
after = engine.model.state_dict()
tower = [k for k in before if ".vision_tower." in k]
assert tower and all(torch.equal(before[k], after[k]) for k in tower), "the vision tower moved"
assert any(not torch.equal(before[k], after[k]) for k in before if "multi_modal_projector" in k), "the projector did not train"
assert any(not torch.equal(before[k], after[k]) for k in before if "language_model" in k), "the language model did not train"
trainable = sum(p.numel() for p in engine.model.parameters() if p.requires_grad)
print("ok", trainable, sum(p.numel() for p in engine.model.parameters()))
"""


@pytest.mark.parametrize("engine_type", ["torch", "deepspeed"])
def test_a_frozen_vision_tower_keeps_its_weights_while_the_rest_trains(tmp_path, engine_type):
    """`trainer.freeze_vision_tower` on both training engines (DeepSpeed ZeRO-2, one gloo rank, in
    a process of its own): one step moves the projector and the language model, not the tower."""
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-c", _FROZEN_STEP, engine_type, str(tmp_path / "m")],
                         capture_output=True, text=True, timeout=300)
    last = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else ""
    assert res.returncode == 0 and last.startswith("ok "), res.stdout[-2000:] + res.stderr[-3000:]
    trainable, total = map(int, last.split()[1:3])
    assert 0 < trainable < total


def test_a_vlm_checkpoint_resumes_whatever_names_save_pretrained_wrote(tmp_path):
    """transformers saves LLaVA's weights under its legacy names (`language_model.model.*`,
    `vision_tower.*`); the torch engine's resume maps them back: the same weights, the optimiser's
    state restored (a trainer killed mid-run resumed from its checkpoint, tests/test_restart_images.py)."""
    from streamrft.config import TrainerConfig
    from streamrft.engine.training import make_train_engine
    from streamrft.engine.shards import load_shards

    model, _ = build_tiny_vlm(tmp_path / "m", ALPHABET, hidden_size=32, layers=1, heads=2)
    engine = make_train_engine(TrainerConfig(lr=0.01), model)
    loss = sum(p.float().pow(2).sum() for p in model.parameters())
    engine.backward(loss)
    engine.step()
    (tmp_path / "ckpt").mkdir()
    engine.save(tmp_path / "ckpt")
    assert any(k.startswith("language_model.") for k in load_shards(tmp_path / "ckpt"))  # the on-disk names
    fresh, _ = build_tiny_vlm(tmp_path / "m2", ALPHABET, hidden_size=32, layers=1, heads=2, seed=1)
    resumed = make_train_engine(TrainerConfig(lr=0.01), fresh)
    resumed.load(tmp_path / "ckpt")
    saved = model.state_dict()
    assert all(torch.equal(saved[k], v) for k, v in fresh.state_dict().items())
    assert resumed.updates == 1
