"""Images stored once in S3 by content hash, fetched by reference through a local cache.

Records never carry pixels: a task, an observation or a gateway message carries `ImageRef`s
(`schemas.py`), and the image file lives at `s3://<bucket>/<namespace>/media/<sha256>.<ext>`,
written by whoever first sees it (`MediaStore.put`: a second put of the same bytes writes
nothing). Readers (`MediaStore.get`) keep a content-addressed cache on local disk and check every
image before use: its bytes against the reference's sha256, then that it decodes as the
reference's format, at its width and height, within the limits. Whatever fails raises
`MediaError` naming the reference's field, never a half-read image.

`resolve_source` turns what a task file may give (a path, `file://` or `s3://` URL, a `data:`
URL or bare base64) into bytes.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import io
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from streamrft.config import S3Config
from streamrft.infra.objectstore import WeightStore, read_object
from streamrft.schemas import IMAGE_MIMES, MAX_IMAGE_SIDE, ImageRef

EXTENSIONS = {"image/png": "png", "image/jpeg": "jpg", "image/webp": "webp", "image/gif": "gif"}
PIL_FORMATS = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif"}


class MediaError(ValueError):
    """An image that cannot be used: `field` names what is wrong (`sha256`, `uri`, `width`, ...)."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field, self.reason = field, reason


@dataclass(frozen=True)
class MediaLimits:
    max_bytes: int = 8 << 20  # an image file
    max_pixels: int = 4096 * 4096  # width x height (a decompression bomb is refused before decoding)


def inspect(data: bytes, limits: MediaLimits = MediaLimits()) -> tuple[str, int, int]:
    """(mime, width, height) of an image file's bytes, checked to decode whole; MediaError otherwise."""
    from PIL import Image, UnidentifiedImageError

    if len(data) > limits.max_bytes:
        raise MediaError("bytes", f"{len(data)} bytes, more than the limit of {limits.max_bytes}")
    try:
        with Image.open(io.BytesIO(data)) as im:
            mime = PIL_FORMATS.get(im.format or "")
            if mime is None:
                raise MediaError("mime", f"format {im.format!r} is not one of {', '.join(IMAGE_MIMES)}")
            w, h = im.size
            if max(w, h) > MAX_IMAGE_SIDE or w * h > limits.max_pixels:
                raise MediaError("width", f"{w} x {h} pixels, more than the limit of {limits.max_pixels} "
                                          f"(and {MAX_IMAGE_SIDE} a side)")
            im.load()  # decode it all: a truncated file fails here, not in a worker later
    except MediaError:
        raise
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        raise MediaError("bytes", f"not a readable image ({type(e).__name__}: {e})") from None
    return mime, w, h


def resolve_source(source: str, base_dir: Path | None = None, store: "MediaStore | None" = None) -> bytes:
    """An image's bytes from what a task file gives: a path (relative to `base_dir`), `file://...`,
    `s3://bucket/key` (through `store`), `data:image/...;base64,...`, or bare base64."""
    if source.startswith("data:"):
        head, _, payload = source.partition(",")
        if ";base64" not in head:
            raise MediaError("image", "a data: URL must be base64 (data:image/png;base64,...)")
        return _b64(payload)
    if source.startswith("s3://"):
        if store is None:
            raise MediaError("image", f"{source}: an s3:// image needs the run's store")
        bucket, _, key = source[len("s3://"):].partition("/")
        return store.read(bucket, key)
    if source.startswith("file://"):
        source = source[len("file://"):]
    path = Path(source)
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    if path.is_file():
        return path.read_bytes()
    if len(source) > 256 and "/" not in source[:64]:  # not a path: bare base64
        return _b64(source)
    raise MediaError("image", f"{source}: no such file")


def _b64(payload: str) -> bytes:
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as e:
        raise MediaError("image", f"invalid base64 ({e})") from None


class MediaStore(WeightStore):
    """The run's images in S3 under `<namespace>/media/`, with a local cache keyed by sha256."""

    def __init__(self, cfg: S3Config, namespace: str, cache_dir: str | Path | None = None,
                 limits: MediaLimits = MediaLimits(), client=None):
        super().__init__(cfg, client)
        self.namespace, self.limits = namespace, limits
        self.cache = Path(cache_dir) if cache_dir else Path(tempfile.gettempdir()) / "streamrft-media"  # made when first written

    @classmethod
    def for_run(cls, cfg) -> "MediaStore":
        """The run's store (`cfg`: a `RunConfig`), cached under its output directory: what every role uses."""
        return cls(cfg.s3, cfg.namespace, Path(cfg.output_dir) / "cache" / "media")

    def key(self, sha256: str, mime: str) -> str:
        return f"{self.namespace}/media/{sha256}.{EXTENSIONS[mime]}"

    def put(self, data: bytes) -> ImageRef:
        """Store an image file once (by its content hash) and return its reference; MediaError if
        it is not a usable image."""
        mime, w, h = inspect(data, self.limits)
        sha = hashlib.sha256(data).hexdigest()
        key = self.key(sha, mime)
        if not self._cached(sha).exists():
            if not self._exists(key):
                self._retry(f"upload {key}", lambda: self.client.put_object(
                    self.bucket, key, io.BytesIO(data), len(data), content_type=mime))
            self._to_cache(sha, data)
        return ImageRef(sha256=sha, uri=f"s3://{self.bucket}/{key}", width=w, height=h, mime=mime)

    def get(self, ref: ImageRef) -> bytes:
        """The image's bytes, checked against the reference (hash, format, size, limits)."""
        path = self._cached(ref.sha256)
        if path.exists():
            data = path.read_bytes()
            if hashlib.sha256(data).hexdigest() == ref.sha256:
                self._check(ref, data)
                return data
            path.unlink(missing_ok=True)  # a damaged cache entry: fetch it again
        bucket, _, key = ref.uri[len("s3://"):].partition("/")
        if bucket != self.bucket:
            raise MediaError("uri", f"{ref.uri}: not in this run's bucket {self.bucket!r}")
        data = self.read(bucket, key)
        got = hashlib.sha256(data).hexdigest()
        if got != ref.sha256:
            raise MediaError("sha256", f"{ref.uri} holds bytes of sha256 {got}, not {ref.sha256}")
        self._check(ref, data)
        self._to_cache(ref.sha256, data)
        return data

    def reference(self, uri: str) -> ImageRef:
        """The reference of an image already in this run's media (`s3://<bucket>/<namespace>/media/
        <sha256>.<ext>`), checked as `get` checks it. Anything else in the store is refused: a
        client naming an s3:// URL reads the run's media, never its weights or another run's."""
        bucket, _, key = uri[len("s3://"):].partition("/") if uri.startswith("s3://") else ("", "", "")
        m = re.fullmatch(re.escape(self.namespace) + r"/media/([0-9a-f]{64})\.(\w+)", key)
        mime = next((k for k, ext in EXTENSIONS.items() if m and ext == m.group(2)), None)
        if bucket != self.bucket or m is None or mime is None:
            raise MediaError("uri", f"{uri}: not an image of this run's media "
                                    f"(s3://{self.bucket}/{self.namespace}/media/<sha256>.<ext>)")
        data = self.read(bucket, key)
        got = hashlib.sha256(data).hexdigest()
        if got != m.group(1):
            raise MediaError("sha256", f"{uri} holds bytes of sha256 {got}")
        found, w, h = inspect(data, self.limits)
        if found != mime:
            raise MediaError("mime", f"{uri} is {found}, its name says {mime}")
        self._to_cache(got, data)
        return ImageRef(sha256=got, uri=uri, width=w, height=h, mime=mime)

    def image(self, ref: ImageRef):
        """The image as an RGB `PIL.Image` (what processors take)."""
        from PIL import Image

        with Image.open(io.BytesIO(self.get(ref))) as im:
            return im.convert("RGB")

    def read(self, bucket: str, key: str) -> bytes:
        from minio.error import S3Error

        if bucket != self.bucket:
            raise MediaError("uri", f"s3://{bucket}/{key}: not in this run's bucket {self.bucket!r}")
        try:
            stat = self._retry(f"stat {key}", self.client.stat_object, bucket, key)
        except S3Error as e:
            if e.code in ("NoSuchKey", "NoSuchObject", "NotFound"):
                raise MediaError("uri", f"s3://{bucket}/{key}: no such image in the store") from None
            raise
        if stat.size is not None and stat.size > self.limits.max_bytes:
            raise MediaError("bytes", f"s3://{bucket}/{key}: {stat.size} bytes, more than the limit of "
                                      f"{self.limits.max_bytes}")
        return self._retry(f"read {key}", read_object, self.client, bucket, key)

    def _check(self, ref: ImageRef, data: bytes) -> None:
        mime, w, h = inspect(data, self.limits)
        if mime != ref.mime:
            raise MediaError("mime", f"{ref.uri} is {mime}, the reference says {ref.mime}")
        if (w, h) != (ref.width, ref.height):
            raise MediaError("width", f"{ref.uri} is {w} x {h} pixels, the reference says {ref.width} x {ref.height}")

    def _exists(self, key: str) -> bool:
        from minio.error import S3Error

        try:
            self._retry(f"stat {key}", self.client.stat_object, self.bucket, key)
            return True
        except S3Error as e:
            if e.code in ("NoSuchKey", "NoSuchObject", "NotFound"):
                return False
            raise

    def _cached(self, sha256: str) -> Path:
        return self.cache / sha256[:2] / sha256

    def _to_cache(self, sha256: str, data: bytes) -> None:
        path = self._cached(sha256)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)  # readers see a whole file or none
