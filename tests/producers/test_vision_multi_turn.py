"""Multi-turn episodes whose observations show pictures, on the tiny VLM and the real stack's S3.

An environment shows a picture with its first observation and another after the model's first
turn (`envs.Observation`); the task shows one of its own. Lockstep and one by one alike: every
picture is stored once by its sha256 and the trajectory names all three in placeholder order; the
placeholders of the later picture sit in the response, masked 0; stream ops' image check passes the
group; the trainer's batch (its pixels fetched by reference) recomputes the recorded log-probs; an
image the environment shows that cannot be used fails that episode (env_error), never the explorer.
"""
from __future__ import annotations

import hashlib
import io

import pytest
import torch
from PIL import Image

from streamrft.engine.rollout.base import SamplingParams
from streamrft.producers.envs import Observation
from streamrft.producers.workflows.episodes import ENV_ERROR, TurnLimits, run_episodes
from streamrft.producers.workflows.multi_turn import multi_turn
from streamrft.producers.workflows.scheduler import play_all
from streamrft.schemas import Task


def _png(colour) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (32, 32), colour).save(buf, format="PNG")
    return buf.getvalue()


RED, GREEN = _png((220, 30, 30)), _png((30, 200, 30))
BLUE = Image.new("RGB", (32, 32), (30, 30, 220))  # shown as a PIL image: stored as PNG


class ShowTwo:
    """A picture with the first observation, another after the first answer, then the end."""

    def __init__(self, broken: bool = False):
        self.broken = broken

    def reset(self, task):
        self.turns = 0
        return Observation("look:", (RED,))

    def step(self, action):
        self.turns += 1
        if self.turns == 1:
            return Observation(" and now:", (b"not a picture" if self.broken else BLUE,)), 0.0, False, {}
        return "", 1.0, True, {}


@pytest.fixture(scope="module")
def vlm(stack, tmp_path_factory):
    from streamrft.engine.rollout.hf import TransformersEngine
    from streamrft.engine.vlm import build_tiny_vlm
    from streamrft.infra.media import MediaStore
    from streamrft.producers.image_tasks import ALPHABET
    from streamrft.producers.workflows.prompts import TaskImages

    out = tmp_path_factory.mktemp("vlm-turns")
    build_tiny_vlm(out / "m", ALPHABET, hidden_size=32, layers=1, heads=2)
    engine = TransformersEngine(str(out / "m"))
    media = MediaStore(stack.s3, "vision-turns", out / "cache")
    media.ensure_bucket()
    engine.vision = TaskImages(engine.processor, media)
    task = Task(task_id="t", prompt="", answer="x", images=[media.put(GREEN)])
    return engine, media, task


def _params(engine) -> SamplingParams:
    # every token stops a turn: each model turn is one sampled token, and the episode goes on
    return SamplingParams(n=2, max_new_tokens=2, temperature=1.0, seed=3,
                          stop_token_ids=list(range(len(engine.tokenizer))))


@pytest.mark.parametrize("play", [run_episodes, play_all], ids=["lockstep", "one_by_one"])
def test_pictures_in_later_turns_travel_by_reference_and_the_trainer_sees_what_was_sampled(vlm, play):
    from streamrft.consumers.batch import collate, token_logprobs
    from streamrft.engine.vlm import trajectory_pixels
    from streamrft.stream_ops.images import ImageCheck

    engine, media, task = vlm
    (group,) = multi_turn(engine, [task], _params(engine), version=0, team="t", env=ShowTwo,
                          limits=TurnLimits(max_turns=3, max_total_tokens=200), play=play)
    image_id = engine.processor.image_token_id
    shas = [hashlib.sha256(b).hexdigest() for b in (GREEN, RED)]
    for t in group.trajectories:
        assert t.info["turns"] == 2 and t.finish_reason == "env_done"
        assert [r.sha256 for r in t.images[:2]] == shas and len(t.images) == 3  # the task's, the reset's, the step's
        assert media.image(t.images[2]).getpixel((0, 0)) == (30, 30, 220)  # BLUE, stored as PNG
        assert t.prompt_ids.count(image_id) == 32 and t.response_ids.count(image_id) == 16
        assert all(m == 0 for tok, m in zip(t.response_ids, t.mask()) if tok == image_id)
    ImageCheck(media, engine.processor)(group)  # stream ops' check passes it
    # the trainer's batch: pixels fetched by reference, the same log-probs as recorded
    samples = [(t, 1.0, 1.0) for t in group.trajectories]
    batch = collate(samples, engine.tokenizer.pad_token_id, pixels=trajectory_pixels(engine.processor, media))
    assert batch.pixel_values.shape[0] == 6
    with torch.no_grad():
        logp, _ = token_logprobs(engine.model, batch)
    recorded = batch.old_logprobs[batch.mask == 1]
    assert (logp[batch.mask == 1] - recorded).abs().max().item() <= 1e-4


def test_an_unusable_picture_fails_its_episode_not_the_explorer(vlm):
    engine, _, task = vlm
    (row,) = run_episodes(engine, [task], _params(engine), env=lambda: ShowTwo(broken=True),
                          limits=TurnLimits(max_turns=3, max_total_tokens=200))
    assert [e.finish_reason for e in row] == [ENV_ERROR, ENV_ERROR]
    assert "cannot be used" in row[0].error and "bytes" in row[0].error
