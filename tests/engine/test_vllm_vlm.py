"""vLLM with a vision-language model (GPU only: `pytest -m gpu`): the tiny VLM made here samples
with each prompt's images through `multi_modal_data`, its placeholders are never sampled, and every
recorded log-prob is the transformers forward's with the same pixels (as the trainer recomputes)."""
from __future__ import annotations

import random

import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def vlm_setup(tmp_path_factory):
    torch = pytest.importorskip("torch")
    pytest.importorskip("vllm")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from streamrft.engine.rollout.vllm_engine import VLLMEngine
    from streamrft.engine.vlm import build_tiny_vlm
    from streamrft.producers.image_tasks import ALPHABET

    path = tmp_path_factory.mktemp("tiny_vlm")
    # head_dim 64 on both sides: a size every vLLM attention backend supports
    build_tiny_vlm(path, ALPHABET, hidden_size=128, heads=2, vision_hidden_size=128, vision_heads=2)
    engine = VLLMEngine(str(path), dtype="float32", gpu_memory_utilization=0.2, kv_cache_gib=0.25,
                        max_model_len=128, enforce_eager=True)
    yield engine, path
    engine.close()


def test_vllm_samples_a_vlm_with_its_images(vlm_setup):
    import torch

    from streamrft.consumers.batch import collate, token_logprobs
    from streamrft.engine.models import load_policy
    from streamrft.engine.rollout.base import SamplingParams
    from streamrft.engine.vlm import IMAGE_TOKEN
    from streamrft.producers.image_tasks import PROMPTS, draw_task
    from streamrft.schemas import ImageRef, Trajectory

    engine, path = vlm_setup
    rng = random.Random(0)
    pictures = [draw_task(kind, rng)[0] for kind in ("count", "largest")]
    proc = engine.processor
    prompts = [proc(text=[IMAGE_TOKEN + PROMPTS[k]], images=[im], return_tensors="pt")["input_ids"][0].tolist()
               for k, im in zip(("count", "largest"), pictures)]
    out = engine.generate(prompts, SamplingParams(n=4, max_new_tokens=6, temperature=1.0, seed=3),
                          images=[[im] for im in pictures])
    image_id = proc.tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    model, _ = load_policy(path)
    trajs, pixels = [], {}
    for i, completions in enumerate(out):
        sha = f"{i:064x}"
        pixels[sha] = proc.image_processor(images=[pictures[i]], return_tensors="pt")["pixel_values"]
        for c in completions:
            assert image_id not in c.token_ids
            trajs.append(Trajectory(group_id="g", task_id="t", model_version=0, prompt_ids=prompts[i],
                                    response_ids=c.token_ids, logprobs=[min(lp, 0.0) for lp in c.logprobs],
                                    images=[ImageRef(sha256=sha, uri=f"s3://weights/m/{sha}.png", width=32, height=32,
                                                     mime="image/png")]))
    batch = collate([(t, 0.0, 0.0) for t in trajs], proc.tokenizer.pad_token_id,
                    pixels=lambda t: pixels[t.images[0].sha256])
    with torch.no_grad():
        logp, _ = token_logprobs(model, batch)
    assert torch.allclose(logp * batch.mask, batch.old_logprobs * batch.mask, atol=2e-3)
