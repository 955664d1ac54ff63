"""Weight versions in an S3 bucket (MinIO API): publish, list, fetch with verification, GC.

Layout: `s3://<bucket>/<model>/v<N>/<file>` plus `manifest.json` (every file's size and sha256),
written LAST. A version exists only once its manifest does, so a publisher that dies mid-upload
leaves nothing a reader would load; `fetch_version` verifies every byte before returning.
"""
from __future__ import annotations

import hashlib
import io
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path

from minio import Minio
from minio.deleteobjects import DeleteObject

from streamrft.config import S3Config

MANIFEST = "manifest.json"
_VERSION_RE = re.compile(r"^v(\d+)/" + re.escape(MANIFEST) + "$")


class CorruptVersionError(RuntimeError):
    """A fetched file does not match the size or sha256 its manifest records."""


@dataclass
class Manifest:
    model: str
    version: int
    files: dict[str, dict]  # name -> {"size": int, "sha256": str}
    created_at: float
    meta: dict

    def to_bytes(self) -> bytes:
        return json.dumps(self.__dict__, sort_keys=True, indent=1).encode()

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.to_bytes()).hexdigest()


def sha256_file(path: Path, chunk: int = 8 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def make_client(cfg: S3Config) -> Minio:
    return Minio(cfg.endpoint, access_key=cfg.access_key, secret_key=cfg.secret_key,
                 secure=cfg.secure, region=cfg.region)


class WeightStore:
    def __init__(self, cfg: S3Config, client: Minio | None = None):
        self.client = client or make_client(cfg)
        self.bucket = cfg.bucket

    def ensure_bucket(self) -> None:
        if not self.client.bucket_exists(self.bucket):
            self.client.make_bucket(self.bucket)

    @staticmethod
    def prefix(model: str, version: int) -> str:
        return f"{model}/v{version}/"

    def publish_version(self, model: str, version: int, files: list[Path], meta: dict | None = None) -> Manifest:
        """Upload `files` (flat names), then the manifest; returns the manifest written."""
        prefix = self.prefix(model, version)
        entries = {}
        for path in map(Path, files):
            digest = sha256_file(path)
            self.client.fput_object(self.bucket, prefix + path.name, str(path))
            entries[path.name] = {"size": path.stat().st_size, "sha256": digest}
        manifest = Manifest(model, version, entries, time.time(), meta or {})
        data = manifest.to_bytes()
        self.client.put_object(self.bucket, prefix + MANIFEST, io.BytesIO(data), len(data),
                               content_type="application/json")
        return manifest

    def list_versions(self, model: str) -> list[int]:
        """Versions whose manifest exists, ascending."""
        versions = []
        for obj in self.client.list_objects(self.bucket, prefix=f"{model}/", recursive=True):
            m = _VERSION_RE.match(obj.object_name[len(model) + 1:])
            if m:
                versions.append(int(m.group(1)))
        return sorted(versions)

    def latest_version(self, model: str) -> int | None:
        versions = self.list_versions(model)
        return versions[-1] if versions else None

    def read_manifest(self, model: str, version: int) -> Manifest:
        resp = self.client.get_object(self.bucket, self.prefix(model, version) + MANIFEST)
        try:
            return Manifest(**json.loads(resp.read()))
        finally:
            resp.close()
            resp.release_conn()

    def fetch_version(self, model: str, version: int, dest: Path) -> Manifest:
        """Download every file of a version into `dest` and verify it; raises CorruptVersionError."""
        manifest = self.read_manifest(model, version)
        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=True)
        prefix = self.prefix(model, version)
        for name, expect in manifest.files.items():
            target = dest / name
            self.client.fget_object(self.bucket, prefix + name, str(target))
            size = target.stat().st_size
            if size != expect["size"]:
                raise CorruptVersionError(f"{prefix}{name}: {size} bytes, manifest says {expect['size']}")
            digest = sha256_file(target)
            if digest != expect["sha256"]:
                raise CorruptVersionError(f"{prefix}{name}: sha256 {digest[:12]}…, manifest says {expect['sha256'][:12]}…")
        (dest / MANIFEST).write_bytes(manifest.to_bytes())
        return manifest

    def delete_version(self, model: str, version: int) -> None:
        prefix = self.prefix(model, version)
        # the manifest goes first so that no reader lists a half-deleted version
        self.client.remove_object(self.bucket, prefix + MANIFEST)
        objs = [DeleteObject(o.object_name) for o in self.client.list_objects(self.bucket, prefix=prefix, recursive=True)]
        for err in self.client.remove_objects(self.bucket, objs):
            raise RuntimeError(f"could not delete {err.name}: {err.message}")

    def gc(self, model: str, keep: int) -> list[int]:
        """Delete all but the newest `keep` versions; returns the versions deleted."""
        if keep < 1:
            raise ValueError("keep must be >= 1")
        old = self.list_versions(model)[:-keep]
        for v in old:
            self.delete_version(model, v)
        return old

    def object_counts(self) -> dict[str, int]:
        """Objects per top-level prefix of the bucket (for `streamrft status`)."""
        counts: dict[str, int] = {}
        for obj in self.client.list_objects(self.bucket, recursive=True):
            top = obj.object_name.split("/", 1)[0]
            counts[top] = counts.get(top, 0) + 1
        return counts
