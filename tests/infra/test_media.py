"""Images in S3 by content hash, on the real embedded stack: stored once, read back through the
local cache, and every bad image (not an image, too large, missing, another hash, another size)
refused with the field at fault."""
from __future__ import annotations

import base64
import hashlib
import io

import pytest
from PIL import Image

from streamrft.infra.media import MediaError, MediaLimits, MediaStore, inspect, resolve_source
from streamrft.schemas import ImageRef


def _png(size=(8, 6), colour=(255, 0, 0)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture
def media(stack, namespace, tmp_path) -> MediaStore:
    store = MediaStore(stack.s3, namespace, tmp_path / "cache")
    store.ensure_bucket()
    return store


def test_an_image_is_stored_once_by_its_hash_and_read_back_checked(media, stack, namespace, tmp_path):
    data = _png()
    ref = media.put(data)
    sha = hashlib.sha256(data).hexdigest()
    assert ref == ImageRef(sha256=sha, uri=f"s3://{stack.s3.bucket}/{namespace}/media/{sha}.png", width=8, height=6,
                           mime="image/png")
    assert media.put(data) == ref  # the same bytes: the same object, nothing written again
    assert [o.object_name for o in media.client.list_objects(stack.s3.bucket, f"{namespace}/media/")] == \
        [f"{namespace}/media/{sha}.png"]
    # another reader, with a cache of its own, gets the same bytes from S3, then from its cache
    other = MediaStore(stack.s3, namespace, tmp_path / "other-cache")
    assert other.get(ref) == data and (tmp_path / "other-cache" / sha[:2] / sha).read_bytes() == data
    assert other.image(ref).size == (8, 6)
    # a damaged cache entry is fetched again, never used
    (tmp_path / "other-cache" / sha[:2] / sha).write_bytes(b"rot")
    assert other.get(ref) == data


def test_every_bad_image_is_refused_naming_the_field(media, stack, namespace, tmp_path):
    ref = media.put(_png())
    fresh = iter(range(100))  # readers with nothing cached: what they check is what S3 holds
    reader = lambda: MediaStore(stack.s3, namespace, tmp_path / f"fresh-{next(fresh)}")  # noqa: E731
    with pytest.raises(MediaError, match="^bytes: not a readable image"):
        media.put(b"\x89PNG\r\n\x1a\n not really")
    with pytest.raises(MediaError, match="^bytes: not a readable image"):
        media.put(_png()[:40])  # truncated
    with pytest.raises(MediaError, match="^width: 100 x 100 pixels, more than the limit of 2500"):
        MediaStore(stack.s3, namespace, tmp_path / "small", limits=MediaLimits(max_pixels=2500)).put(_png((100, 100)))
    with pytest.raises(MediaError, match="^bytes: .* more than the limit of 10"):
        inspect(_png(), MediaLimits(max_bytes=10))
    other = hashlib.sha256(b"another").hexdigest()
    with pytest.raises(MediaError, match="^uri: .* no such image in the store"):
        media.get(ref.model_copy(update={"sha256": other, "uri": ref.uri.replace(ref.sha256, other)}))
    with pytest.raises(MediaError, match=f"^sha256: .* not {other}"):
        media.get(ref.model_copy(update={"sha256": other}))  # the object there holds other bytes
    with pytest.raises(MediaError, match="^width: .* is 8 x 6 pixels, the reference says 9 x 6"):
        reader().get(ref.model_copy(update={"width": 9}))
    with pytest.raises(MediaError, match="^mime: .* is image/png, the reference says image/jpeg"):
        reader().get(ref.model_copy(update={"mime": "image/jpeg"}))
    with pytest.raises(MediaError, match="^uri: .* not in this run's bucket"):
        reader().get(ref.model_copy(update={"uri": ref.uri.replace(stack.s3.bucket, "elsewhere", 1)}))


def test_a_task_file_may_give_a_path_a_url_or_base64(media, stack, tmp_path):
    data = _png()
    (tmp_path / "pics").mkdir()
    (tmp_path / "pics" / "a.png").write_bytes(data)
    b64 = base64.b64encode(data).decode()
    assert resolve_source("pics/a.png", base_dir=tmp_path) == data
    assert resolve_source(f"file://{tmp_path}/pics/a.png") == data
    assert resolve_source(f"data:image/png;base64,{b64}") == data
    ref = media.put(data)
    assert resolve_source(ref.uri, store=media) == data
    with pytest.raises(MediaError, match="^image: .* no such file"):
        resolve_source("pics/missing.png", base_dir=tmp_path)
    with pytest.raises(MediaError, match="^image: invalid base64"):
        resolve_source("data:image/png;base64,@@@")
