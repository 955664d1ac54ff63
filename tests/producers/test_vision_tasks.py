"""Image tasks from a task file to the trainer's log-probs, on the real embedded stack's S3: the
file's pictures are stored by hash, the explorer's workflows (lockstep and one by one) prompt the
tiny VLM with them and record their references, and a trainer elsewhere (its own cache) fetches
the same bytes by hash and recomputes every recorded log-prob."""
from __future__ import annotations

import asyncio
import hashlib
import json

import pytest
import torch

from streamrft.consumers.batch import collate, token_logprobs
from streamrft.engine.rollout.base import SamplingParams
from streamrft.engine.rollout.hf import TransformersEngine
from streamrft.engine.vlm import IMAGE_TOKEN, build_tiny_vlm
from streamrft.infra.media import MediaStore
from streamrft.producers.image_tasks import ALPHABET, make_image_tasks
from streamrft.producers.tasks import load_task_file
from streamrft.producers.workflows import TurnLimits, single_turn
from streamrft.producers.workflows.scheduler import EpisodeScheduler
from streamrft.producers.workflows.single_turn import completion_group
from streamrft.producers.workflows.prompts import TaskImages, prompt_of


def test_image_tasks_from_a_file_reach_the_trainer_by_hash(stack, namespace, tmp_path):
    rows = make_image_tasks(6, tmp_path / "pics", seed=0)
    task_file = tmp_path / "tasks.jsonl"
    task_file.write_text("".join(json.dumps({**r, "image": f"pics/{r['image']}"}) + "\n" for r in rows))
    with pytest.raises(ValueError, match="row 0: it has images, and this reader has no store"):
        load_task_file(task_file)
    media = MediaStore(stack.s3, namespace, tmp_path / "explorer-cache")
    media.ensure_bucket()
    tasks = load_task_file(task_file, media=media)
    for row, task in zip(rows, tasks):  # stored by the hash of the file's bytes
        assert task.images[0].sha256 == hashlib.sha256((tmp_path / "pics" / row["image"]).read_bytes()).hexdigest()
        assert "image" not in task.metadata

    build_tiny_vlm(tmp_path / "vlm", ALPHABET)
    engine = TransformersEngine(str(tmp_path / "vlm"))
    with pytest.raises(ValueError, match="shows 1 image.*not a vision-language model"):
        prompt_of(engine, tasks[0])
    engine.vision = TaskImages(engine.processor, media)
    params = SamplingParams(n=3, max_new_tokens=3, temperature=1.0)
    groups = single_turn(engine, tasks[:3], params, version=0, team="default")  # lockstep

    async def one_by_one():
        sched = EpisodeScheduler(engine, params, env=None, limits=TurnLimits(max_turns=1, max_total_tokens=64))
        sched.start()
        try:
            out = []
            for task in tasks[3:]:
                prompt, completions, version = await sched.sample(task, 3, seed=5)
                out.append(completion_group(task, prompt, completions, version=version, team="default"))
            return out
        finally:
            await sched.close()

    groups += asyncio.run(one_by_one())
    image_id = engine.processor.tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    for task, group in zip(tasks, groups):
        for t in group.trajectories:
            assert t.images == task.images and t.prompt_ids.count(image_id) == 16

    # the trainer, on another machine: its own cache, the bytes from S3 by hash
    trainer_media = MediaStore(stack.s3, namespace, tmp_path / "trainer-cache")
    processor = engine.processor
    pixels = lambda t: processor.image_processor(images=[trainer_media.image(r) for r in t.images],  # noqa: E731
                                                 return_tensors="pt")["pixel_values"]
    samples = [(t, 0.0, 0.0) for g in groups for t in g.trajectories]
    batch = collate(samples, processor.tokenizer.pad_token_id, pixels=pixels)
    with torch.no_grad():
        logp, _ = token_logprobs(engine.model, batch)
    assert torch.allclose(logp * batch.mask, batch.old_logprobs * batch.mask, atol=1e-5)
    fetched = {p.name for p in (tmp_path / "trainer-cache").rglob("*") if p.is_file()}
    assert fetched == {t.images[0].sha256 for t, _, _ in samples}
