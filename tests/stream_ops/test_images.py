"""Stream ops' image check on the real stack's S3: a good image group is scored; each bad one (an
image missing from the store, another hash, a prompt whose placeholders do not match its images, a
placeholder in a response, images that are not the task's, images sent to a text model) is a dead
letter naming the field, through the worker's own `route_record`."""
from __future__ import annotations

import io
import random

import pytest
from PIL import Image

from streamrft.config import load_config
from streamrft.engine.vlm import IMAGE_TOKEN, build_tiny_vlm
from streamrft.infra.media import MediaStore
from streamrft.producers.image_tasks import ALPHABET, draw_task
from streamrft.schemas import RolloutGroup, Task, Trajectory, decode, encode
from streamrft.stream_ops.app import route_record
from streamrft.stream_ops.scoring import build_scorer
from tests_helpers import stack_overrides


def _png(im) -> bytes:
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture
def vlm_run(stack, namespace, tmp_path):
    _, processor = build_tiny_vlm(tmp_path / "vlm", ALPHABET)
    cfg = load_config("examples/cpu_demo.yaml", [*stack_overrides(stack, tmp_path), f"namespace={namespace}",
                                                 f"model.path={tmp_path / 'vlm'}",
                                                 "stream_ops.rewards=[{name: exact_match}]"])
    media = MediaStore(stack.s3, namespace, tmp_path / "explorer-cache")
    media.ensure_bucket()
    return cfg, processor, media


def _group(processor, media, answer="3", prompt_images=None, traj_images=None, response=None):
    im, _ = draw_task("count", random.Random(1))
    ref = media.put(_png(im))
    task = Task(task_id="t", prompt="how many shapes?", answer=answer, images=[ref])
    ids = processor(text=[IMAGE_TOKEN * (prompt_images or 1) + task.prompt], images=[im] * (prompt_images or 1),
                    return_tensors="pt")["input_ids"][0].tolist()
    tok = processor.tokenizer
    trajs = [Trajectory(group_id="g", task_id="t", model_version=0, prompt_ids=ids,
                        response_ids=response or tok(text, add_special_tokens=False)["input_ids"],
                        logprobs=[-0.5] * len(response or tok(text, add_special_tokens=False)["input_ids"]),
                        response_text=text, images=[ref] if traj_images is None else traj_images)
             for text in ("3", "4")]
    return RolloutGroup(group_id="g", task=task, trajectories=trajs)


def _route(cfg, group: RolloutGroup):
    return route_record(build_scorer(cfg, with_rewards=True), cfg.namespace, encode(group), b"g",
                        f"{cfg.namespace}.rollouts.default", 0, 7)


def test_images_are_checked_before_scoring(vlm_run, stack, tmp_path):
    cfg, processor, media = vlm_run
    good = _group(processor, media)
    assert _route(cfg, good).kind == "experience"

    def dead(group, field):
        out = _route(cfg, group)
        assert out.kind == "dead_letter", out
        reason = decode(out.value).reason
        assert reason.startswith(field), reason
        return reason

    other = good.task.images[0].model_copy(update={"sha256": "0" * 64})
    missing = good.task.images[0].model_copy(update={"sha256": "1" * 64,
                                                     "uri": good.task.images[0].uri.replace(good.task.images[0].sha256, "1" * 64)})
    bad_task = good.model_copy(deep=True)
    bad_task.task.images = [missing]
    for t in bad_task.trajectories:
        t.images = [missing]
    dead(bad_task, "task.images.0.uri: ")
    wrong_hash = good.model_copy(deep=True)
    wrong_hash.task.images = [other]
    for t in wrong_hash.trajectories:
        t.images = [other]
    dead(wrong_hash, "task.images.0.sha256: ")
    dead(_group(processor, media, prompt_images=2), "trajectories.0.prompt_ids: 32 image placeholders for 1 image")
    dead(_group(processor, media, traj_images=[]), "trajectories.0.images: must begin with the task's images")
    image_id = processor.tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    dead(_group(processor, media, response=[image_id, 5]), "trajectories.0.response_ids: an image placeholder")
    # a text model's run takes no images
    text_cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"path": str(tmp_path / "text")})})
    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "config.json").write_text('{"model_type": "qwen2"}')
    out = _route(text_cfg, good)
    assert out.kind == "dead_letter" and decode(out.value).reason.startswith("task.images: this run's model is a text model")
