"""A vision-language model behind the gateway, on the real stack, through the official `openai` client.

The tiny LLaVA built here serves; an agent sends OpenAI `image_url` content parts (`data:` URLs, or
the `s3://` URL of an image already in the run's media). Checks: the image is stored once in S3 by
its sha256 and the episode's trajectory names it; the prompt is laid out as the explorers lay out a
picture task (`image_prompt_ids`); the recorded log-probs are the policy's with those pixels; stream
ops' image check passes the group; an image observation in a later turn is concatenated, its
placeholders masked in the response; and every bad image is a 400 naming its field, with nothing recorded and the gateway
serving on.
"""
from __future__ import annotations

import base64
import hashlib
import io
import string
import uuid

import httpx
import pytest
import torch

from streamrft.schemas import RolloutGroup, decode, topic_name
from tests_helpers import read_all

from gateway_helpers import KEYS, gateway_config, serving

ALPHABET = string.ascii_lowercase + string.digits + " :?"


@pytest.fixture(scope="module")
def vlm(stack, tmp_path_factory):
    from streamrft.engine.vlm import build_tiny_vlm

    out = tmp_path_factory.mktemp("gateway-vlm")
    build_tiny_vlm(out / "vlm", ALPHABET, hidden_size=32, layers=1, heads=2, vision_hidden_size=32,
                   vision_layers=1, vision_heads=2)
    cfg = gateway_config(stack, out, f"gwv-{uuid.uuid4().hex[:8]}", ["explorer.max_total_tokens=96"],
                         model_path=out / "vlm")
    with serving(cfg) as s:
        yield s


def _png(colour: tuple[int, int, int], size: int = 32) -> bytes:
    from PIL import Image, ImageDraw

    im = Image.new("RGB", (size, size), "white")
    ImageDraw.Draw(im).rectangle([4, 4, 20, 24], fill=colour)
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return buf.getvalue()


def _data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def _user(text: str, *urls: str) -> dict:
    return {"role": "user", "content": [*({"type": "image_url", "image_url": {"url": u}} for u in urls),
                                        {"type": "text", "text": text}]}


def _chat(client, messages: list[dict], episode: str, group: str):
    return client.chat.completions.create(model="policy", messages=messages, max_tokens=4, logprobs=True,
                                          extra_headers={"X-Episode-Id": episode, "X-Group-Id": group,
                                                         "X-Group-Size": "1"})


def _finish(s, episode: str, reward: float) -> dict:
    return httpx.post(f"{s.url}/v1/episodes/{episode}/finish", json={"reward": reward},
                      headers={"Authorization": f"Bearer {KEYS['agents']}"}, timeout=60).json()


def _group(s, gid: str) -> RolloutGroup:
    groups = [decode(m.value(), RolloutGroup) for m in read_all(s.cfg.kafka, topic_name(s.cfg.namespace, "rollouts", "agents"))]
    (group,) = [g for g in groups if g.group_id == gid]
    return group


def _image(data: bytes):
    from PIL import Image

    return Image.open(io.BytesIO(data)).convert("RGB")


def test_an_image_url_episode_records_the_picture_by_reference_with_the_sampled_log_probs(vlm):
    from streamrft.engine.vlm import image_prompt_ids, pixel_values
    from streamrft.infra.media import MediaStore
    from streamrft.stream_ops.images import ImageCheck

    processor, client = vlm.engine.processor, vlm.client()
    red = _png((220, 30, 30))
    gid, e = uuid.uuid4().hex, uuid.uuid4().hex
    messages = [_user("how many?", _data_url(red))]
    first = _chat(client, messages, e, gid)
    reply = first.choices[0].message.content
    messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "sure?"}]
    _chat(client, messages, e, gid)  # continues the first call: the same picture, text only
    assert _finish(vlm, e, 1.0)["status"] == "published"
    group = _group(vlm, gid)
    (traj,) = group.trajectories
    assert traj.info["assembly"] == "concatenated"
    # stored once in the run's media by the sha256 of the very bytes the client sent
    (ref,) = traj.images
    assert ref.sha256 == hashlib.sha256(red).hexdigest() and (ref.width, ref.height, ref.mime) == (32, 32, "image/png")
    assert group.task.images == [ref]
    media = MediaStore(vlm.cfg.s3, vlm.cfg.namespace, vlm.cfg.output_dir + "/check-cache")
    assert media.get(ref) == red
    # laid out as an explorer lays out a picture task, and no placeholder in what is trained
    assert traj.prompt_ids == image_prompt_ids(processor, "how many?", [_image(red)])
    assert processor.image_token_id not in traj.response_ids
    ImageCheck(media, processor)(group)  # what stream ops check before scoring: it passes
    # the recorded log-probs are the policy's at v0 given those pixels (teacher-forced)
    ids = torch.tensor([traj.prompt_ids + traj.response_ids])
    with torch.no_grad():
        logits = vlm.engine.model(input_ids=ids, pixel_values=pixel_values(processor, [_image(red)])).logits
    forward = torch.log_softmax(logits[0, len(traj.prompt_ids) - 1: -1].float(), -1) \
        .gather(-1, torch.tensor(traj.response_ids).unsqueeze(-1)).squeeze(-1)
    trained = torch.tensor(traj.loss_mask) == 1
    assert (forward[trained] - torch.tensor(traj.logprobs)[trained]).abs().max().item() <= 1e-4
    # the same picture named by its s3:// URL: the same reference, nothing uploaded again
    gid2, e2 = uuid.uuid4().hex, uuid.uuid4().hex
    _chat(client, [_user("how many?", ref.uri)], e2, gid2)
    assert _finish(vlm, e2, 0.0)["status"] == "published"
    assert _group(vlm, gid2).trajectories[0].images == [ref]


def test_an_image_observation_in_a_later_turn_is_concatenated_with_its_placeholders_masked(vlm):
    from streamrft.infra.media import MediaStore
    from streamrft.stream_ops.images import ImageCheck

    client, gid, e = vlm.client(), uuid.uuid4().hex, uuid.uuid4().hex
    red, blue = _png((220, 30, 30)), _png((30, 30, 220))
    messages = [_user("look:", _data_url(red))]
    reply = _chat(client, messages, e, gid).choices[0].message.content
    messages += [{"role": "assistant", "content": reply}, _user("and now?", _data_url(blue))]
    _chat(client, messages, e, gid)
    assert _finish(vlm, e, 0.5)["status"] == "published"
    group = _group(vlm, gid)
    (traj,) = group.trajectories
    assert traj.info["assembly"] == "concatenated"
    assert [r.sha256 for r in traj.images] == [hashlib.sha256(b).hexdigest() for b in (red, blue)]
    image_id = vlm.engine.processor.image_token_id
    assert traj.prompt_ids.count(image_id) == traj.response_ids.count(image_id) > 0  # the second picture's
    assert all(m == 0 for tok, m in zip(traj.response_ids, traj.loss_mask) if tok == image_id)
    ImageCheck(MediaStore(vlm.cfg.s3, vlm.cfg.namespace, vlm.cfg.output_dir + "/check-cache"), vlm.engine.processor)(group)


@pytest.mark.parametrize("url, field, why", [
    ("file:///etc/hostname", "messages[0].content[0].image_url.url", "data: URL"),
    ("/etc/hostname", "messages[0].content[0].image_url.url", "data: URL"),
    ("data:image/png;base64,bm90IGFuIGltYWdl", "messages[0].content[0].image_url.url", "not a readable image"),
    ("data:image/png;base64,@@@", "messages[0].content[0].image_url.url", "invalid base64"),
    ("data:image/png,rawbytes", "messages[0].content[0].image_url.url", "base64"),
])
def test_a_bad_image_url_is_a_400_naming_its_field(vlm, url, field, why):
    r = httpx.post(f"{vlm.url}/v1/chat/completions", timeout=60, headers={"Authorization": f"Bearer {KEYS['agents']}"},
                   json={"model": "policy", "max_tokens": 2, "messages": [_user("how many?", url)]})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == field and why in error["message"], error


def test_s3_urls_reach_the_runs_media_only_and_image_tokens_cannot_be_typed(vlm):
    from streamrft.infra.objectstore import WeightStore

    headers = {"Authorization": f"Bearer {KEYS['agents']}"}
    bucket, ns = vlm.cfg.s3.bucket, vlm.cfg.namespace
    WeightStore(vlm.cfg.s3).client.put_object(bucket, f"{ns}/secret.png", io.BytesIO(_png((1, 2, 3))), len(_png((1, 2, 3))))
    bogus = "0" * 64
    for url, why in ((f"s3://{bucket}/{ns}/secret.png", "not an image of this run's media"),
                     (f"s3://other-bucket/{ns}/media/{bogus}.png", "not an image of this run's media"),
                     (f"s3://{bucket}/{ns}/media/{bogus}.png", "no such image")):
        r = httpx.post(f"{vlm.url}/v1/chat/completions", headers=headers, timeout=60,
                       json={"model": "policy", "max_tokens": 2, "messages": [_user("hi", url)]})
        assert r.status_code == 400 and why in r.json()["error"]["message"], (url, r.text)
    # an image token typed as text, or sent as a token id: a prompt with placeholders and no image
    image_id = vlm.engine.processor.image_token_id
    for path, body in (("chat/completions", {"messages": [{"role": "user", "content": "<image>how many?"}]}),
                       ("completions", {"prompt": [image_id, image_id, 5]})):
        r = httpx.post(f"{vlm.url}/v1/{path}", headers=headers, timeout=60, json={"model": "policy", "max_tokens": 2, **body})
        assert r.status_code == 400 and "image placeholder" in r.json()["error"]["message"], r.text
    # and the gateway serves on
    ok = vlm.client().chat.completions.create(model="policy", max_tokens=2,
                                              messages=[_user("how many?", _data_url(_png((9, 9, 9))))])
    assert ok.choices[0].message.content is not None
