"""A vision-language model's rollouts, as the trainer sees them: the transformers engine samples
with each prompt's images, and the trainer, given the same images, recomputes every recorded
log-prob (to 1e-5 on the CPU, as for text), whatever rows share the batch and however it is cut
into micro-batches. Image placeholders are prompt tokens: never trained."""
from __future__ import annotations

import random

import pytest
import torch

from streamrft.consumers.batch import collate, token_logprobs
from streamrft.engine.rollout.base import SamplingParams
from streamrft.engine.rollout.hf import TransformersEngine
from streamrft.engine.vlm import IMAGE_TOKEN, build_tiny_vlm
from streamrft.producers.image_tasks import ALPHABET, PROMPTS, draw_task
from streamrft.schemas import ImageRef, Trajectory


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = tmp_path_factory.mktemp("vlm")
    build_tiny_vlm(path, ALPHABET)
    return TransformersEngine(str(path))


def _ref(k: int) -> ImageRef:
    sha = f"{k:064x}"
    return ImageRef(sha256=sha, uri=f"s3://weights/ns/media/{sha}.png", width=32, height=32, mime="image/png")


@pytest.mark.parametrize("n", [1, 3])  # 1: images in generate's first forward; 3: in the shared prefill
def test_recorded_log_probs_are_recomputed_with_the_same_images(engine, n):
    rng = random.Random(n)
    tasks = [draw_task(kind, rng) for kind in ("count", "largest", "digit", "count")]
    proc = engine.processor
    prompts = [proc(text=[IMAGE_TOKEN + PROMPTS[k]], images=[im], return_tensors="pt")["input_ids"][0].tolist()
               for k, (im, _) in zip(("count", "largest", "digit", "count"), tasks)]
    # a text-only prompt shares the call: its rows have no images
    prompts.append(proc.tokenizer("which digit?")["input_ids"])
    images = [[im] for im, _ in tasks] + [[]]
    params = SamplingParams(n=n, max_new_tokens=4, temperature=1.0, seeds=[11, 12, 13, 14, 15])
    out = engine.generate(prompts, params, images=images)
    trajs, pixels = [], {}
    for i, (prompt, completions) in enumerate(zip(prompts, out)):
        for c in completions:
            t = Trajectory(group_id=f"g{i}", task_id=f"t{i}", model_version=0, prompt_ids=prompt,
                           response_ids=c.token_ids, logprobs=[min(lp, 0.0) for lp in c.logprobs],
                           images=[_ref(i)] if images[i] else [])
            trajs.append(t)
            if images[i]:
                pixels[t.images[0].sha256] = proc.image_processor(images=images[i], return_tensors="pt")["pixel_values"]
    samples = [(t, 0.0, 0.0) for t in trajs]
    rng.shuffle(samples)  # rows in another order than the engine's
    batch = collate(samples, proc.tokenizer.pad_token_id,
                    pixels=lambda t: torch.cat([pixels[r.sha256] for r in t.images]))
    image_id = proc.tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    assert batch.pixel_values.shape[0] == sum(1 for t, _, _ in samples if t.images)
    assert not batch.mask[batch.input_ids[:, 1:] == image_id].any()  # placeholders: never trained
    cuts = (list(range(0, len(batch), 2)), list(range(1, len(batch), 2)))  # micro-batches of other rows
    with torch.no_grad():
        whole, _ = token_logprobs(engine.model, batch)
        parts = [token_logprobs(engine.model, batch.select(rows))[0] for rows in cuts]
    recorded = batch.old_logprobs
    assert torch.allclose(whole * batch.mask, recorded * batch.mask, atol=1e-5), \
        float(((whole - recorded) * batch.mask).abs().max())
    for rows, logp in zip(cuts, parts):
        sub = batch.select(rows)
        assert torch.allclose(logp * sub.mask, sub.old_logprobs * sub.mask, atol=1e-5)


def test_images_must_match_the_prompts_placeholders(engine):
    proc = engine.processor
    im, _ = draw_task("count", random.Random(0))
    ids = proc(text=[IMAGE_TOKEN + "how many shapes?"], images=[im], return_tensors="pt")["input_ids"][0].tolist()
    params = SamplingParams(max_new_tokens=2)
    with pytest.raises(ValueError, match="prompt 0 holds 16 image placeholders .* its 2 image.s. expand to 32"):
        engine.generate([ids], params, images=[[im, im]])
    with pytest.raises(ValueError, match="1 image lists for 2 prompts"):
        engine.generate([ids, ids], params, images=[[im]])
    with pytest.raises(ValueError, match="ends with an image placeholder"):
        engine.generate([ids[:17]], params, images=[[im]])  # <bos> and the 16 placeholders
