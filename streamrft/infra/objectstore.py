"""Weight versions in an S3 bucket (MinIO API): publish, list, fetch with verification, GC.

Layout: `s3://<bucket>/<model>/v<N>/<file>` plus `manifest.json` (every file's size and sha256),
written LAST. A version exists only once its manifest does, so a publisher that dies mid-upload
leaves nothing a reader would load; `fetch_version` verifies every byte before returning.
`<model>/base/<digest>/` holds the files of the base model a run's versions are read with (config,
tokenizer; the weights too when versions are LoRA adapters), uploaded once, manifest last, and
addressed by their content: every version's meta names it (`engine.weights.publish_base_model`).
Every S3 call rides out a restart of the server: transient errors (connection refused or reset,
timeouts, 5xx) are retried with exponential backoff for up to `retry_s` seconds, then
`StoreUnavailableError` says so loudly. Each try waits at most `s3.timeout_s` to connect and for
each read, so a half-open connection costs seconds, and pooled connections are dropped after a
transient error. Errors that a retry cannot fix (NoSuchKey, access
denied, a corrupt file) are raised at once.
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
import re
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import urllib3
from minio import Minio
from minio.error import InvalidResponseError, S3Error, ServerError

from streamrft.config import S3Config

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
BASE = "base"
_VERSION_RE = re.compile(r"^v(\d+)/" + re.escape(MANIFEST) + "$")
# S3 error codes that mean "try again later", not "this request is wrong"
_TRANSIENT_CODES = {"InternalError", "ServiceUnavailable", "SlowDown", "RequestTimeout", "OperationAborted"}


class CorruptVersionError(RuntimeError):
    """A fetched file does not match the size or sha256 its manifest records."""


class StoreUnavailableError(RuntimeError):
    """S3 kept failing with transient errors for the whole retry budget."""


def is_transient(err: BaseException) -> bool:
    """True for errors a restarted or overloaded S3 server gives: retrying may succeed."""
    if isinstance(err, S3Error):
        status = getattr(err.response, "status", 0) or 0
        return err.code in _TRANSIENT_CODES or status >= 500
    if isinstance(err, ServerError):  # 5xx without an S3 error document
        return True
    if isinstance(err, InvalidResponseError):  # a non-XML body, e.g. a proxy's 502 page while S3 restarts
        return True
    # urllib3: MaxRetryError (refused, reset), ProtocolError, timeouts; builtins for the same below it
    return isinstance(err, (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError))


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


def file_entries(files: list[Path]) -> dict[str, dict]:
    """name -> {"size", "sha256"} of each file, as a manifest records them."""
    return {p.name: {"size": p.stat().st_size, "sha256": sha256_file(p)} for p in map(Path, files)}


def files_digest(entries: dict[str, dict]) -> str:
    """sha256 over the names and sha256s of `entries`: one digest that pins every byte of a base."""
    return hashlib.sha256(json.dumps({n: e["sha256"] for n, e in entries.items()}, sort_keys=True).encode()).hexdigest()


def make_client(cfg: S3Config) -> Minio:
    # minio's default waits 5 minutes to connect or read and retries on its own; here a failed
    # request goes straight to the store's retries, which bound the total wait and log each try
    import certifi

    http = urllib3.PoolManager(timeout=urllib3.Timeout(connect=cfg.timeout_s, read=cfg.timeout_s), maxsize=10,
                               cert_reqs="CERT_REQUIRED", ca_certs=certifi.where(),
                               retries=urllib3.Retry(total=5, connect=0, read=0, other=0))
    return Minio(cfg.endpoint, access_key=cfg.access_key, secret_key=cfg.secret_key,
                 secure=cfg.secure, region=cfg.region, http_client=http)


def read_object(client: Minio, bucket: str, name: str, offset: int = 0, length: int = 0) -> bytes:
    """An object's bytes (`length` > 0: that many from `offset`), its connection given back."""
    resp = client.get_object(bucket, name, offset=offset, length=length)
    try:
        return resp.read()
    finally:
        resp.close()
        resp.release_conn()


DELETERS = 8  # concurrent DELETEs of a version's files


class WeightStore:
    def __init__(self, cfg: S3Config, client: Minio | None = None, retry_s: float = 60.0):
        self.client = client or make_client(cfg)
        self.bucket = cfg.bucket
        self.endpoint = cfg.endpoint
        self.retry_s = retry_s

    def _retry(self, what: str, fn, *args, **kwargs):
        """`fn(*args, **kwargs)`, retried with exponential backoff while its errors are transient."""
        t0 = time.monotonic()
        deadline = t0 + self.retry_s
        delay, tries = 0.25, 0
        while True:
            try:
                tries += 1
                return fn(*args, **kwargs)
            except Exception as e:
                if not is_transient(e):
                    raise
                self._drop_connections()
                left = deadline - time.monotonic()
                reason = f"{type(e).__name__}: {str(e)[:200]}"
                if left <= 0:
                    raise StoreUnavailableError(
                        f"S3 at {self.endpoint}: {what} failed {tries} time(s) in {time.monotonic() - t0:.0f}s "
                        f"(retry budget {self.retry_s:.0f}s); last error {reason}") from e
                log.warning("S3 %s failed (%s); retrying in %.1fs", what, reason, min(delay, left))
                time.sleep(min(delay, left))
                delay = min(delay * 2, 8.0)

    def _drop_connections(self) -> None:
        """Close the client's pooled keep-alive connections: after a transient error the others to
        the same store may be dead or half-open too, and each would cost a timeout of its own."""
        http = getattr(self.client, "_http", None)  # minio keeps its urllib3 PoolManager there
        if isinstance(http, urllib3.PoolManager):
            http.clear()

    def ensure_bucket(self) -> None:
        if not self._retry("bucket_exists", self.client.bucket_exists, self.bucket):
            self._retry("make_bucket", self.client.make_bucket, self.bucket)

    @staticmethod
    def prefix(model: str, version: int) -> str:
        return f"{model}/v{version}/"

    def publish_version(self, model: str, version: int, files: list[Path], meta: dict | None = None) -> Manifest:
        """Upload `files` (flat names), then the manifest; returns the manifest written.

        Re-publishing a version (a trainer redoing steps after a crash) first removes its old
        manifest, so no reader sees the old manifest over new files while the upload runs.
        """
        prefix = self.prefix(model, version)
        self._retry(f"remove {prefix}{MANIFEST}", self.client.remove_object, self.bucket, prefix + MANIFEST)
        entries = file_entries(files)
        self._upload(prefix, files)
        manifest = Manifest(model, version, entries, time.time(), meta or {})
        self._put(prefix + MANIFEST, manifest.to_bytes())
        return manifest

    def _upload(self, prefix: str, files: list[Path]) -> None:
        for path in map(Path, files):
            self._retry(f"upload {prefix}{path.name}", self.client.fput_object, self.bucket, prefix + path.name, str(path))

    def _put(self, name: str, data: bytes) -> None:
        self._retry(f"upload {name}", lambda: self.client.put_object(
            self.bucket, name, io.BytesIO(data), len(data), content_type="application/json"))

    def _get(self, name: str) -> bytes:
        return self._retry(f"read {name}", read_object, self.client, self.bucket, name)

    def _download(self, prefix: str, entries: dict[str, dict], dest: Path) -> None:
        """Every file of `entries` from `prefix` into `dest`, each checked against its size and sha256."""
        dest.mkdir(parents=True, exist_ok=True)
        for name, expect in entries.items():
            target = dest / name
            self._retry(f"download {prefix}{name}", self.client.fget_object, self.bucket, prefix + name, str(target))
            size = target.stat().st_size
            if size != expect["size"]:
                raise CorruptVersionError(f"{prefix}{name}: {size} bytes, manifest says {expect['size']}")
            digest = sha256_file(target)
            if digest != expect["sha256"]:
                raise CorruptVersionError(f"{prefix}{name}: sha256 {digest[:12]}…, manifest says {expect['sha256'][:12]}…")

    def publish_base(self, model: str, files: list[Path]) -> tuple[str, str]:
        """Upload a base model's `files` under `<model>/base/<digest[:16]>/` unless they are there
        already; returns (that prefix, the digest).

        Addressed by content, so a restarted trainer uploads nothing again, and a run whose base
        changes gets a new prefix while the versions trained on the old base keep theirs.
        """
        entries = file_entries(files)
        digest = files_digest(entries)
        prefix = f"{model}/{BASE}/{digest[:16]}/"
        try:
            self._retry(f"stat {prefix}{MANIFEST}", self.client.stat_object, self.bucket, prefix + MANIFEST)
            return prefix, digest
        except S3Error as e:
            if e.code != "NoSuchKey":
                raise
        self._upload(prefix, files)
        manifest = {"files": entries, "sha256": digest}
        self._put(prefix + MANIFEST, json.dumps(manifest, sort_keys=True, indent=1).encode())
        return prefix, digest

    def fetch_base(self, prefix: str, digest: str, dest: Path) -> list[str]:
        """Download a base's files into `dest`, verified against the `digest` a version's meta
        names (`publish_base`); returns their names. Raises CorruptVersionError on any mismatch."""
        entries = json.loads(self._get(prefix + MANIFEST))["files"]
        if files_digest(entries) != digest:
            raise CorruptVersionError(f"{prefix}{MANIFEST} lists files of digest {files_digest(entries)[:12]}…, "
                                      f"the version names {digest[:12]}…")
        self._download(prefix, entries, Path(dest))
        return sorted(entries)

    def _list(self, prefix: str) -> list:
        # list_objects is lazy: the whole listing is one retried unit
        return self._retry(f"list {prefix}", lambda: list(self.client.list_objects(self.bucket, prefix=prefix,
                                                                                     recursive=True)))

    def list_versions(self, model: str) -> list[int]:
        """Versions whose manifest exists, ascending."""
        versions = []
        for obj in self._list(f"{model}/"):
            m = _VERSION_RE.match(obj.object_name[len(model) + 1:])
            if m:
                versions.append(int(m.group(1)))
        return sorted(versions)

    def latest_version(self, model: str) -> int | None:
        versions = self.list_versions(model)
        return versions[-1] if versions else None

    def read_manifest(self, model: str, version: int) -> Manifest:
        return Manifest(**json.loads(self._get(self.prefix(model, version) + MANIFEST)))

    def fetch_version(self, model: str, version: int, dest: Path) -> Manifest:
        """Download every file of a version into `dest` and verify it; raises CorruptVersionError."""
        manifest = self.read_manifest(model, version)
        dest = Path(dest)
        self._download(self.prefix(model, version), manifest.files, dest)
        (dest / MANIFEST).write_bytes(manifest.to_bytes())
        return manifest

    def delete_version(self, model: str, version: int) -> None:
        prefix = self.prefix(model, version)
        # the manifest goes first so that no reader lists a half-deleted version
        self._retry(f"remove {prefix}{MANIFEST}", self.client.remove_object, self.bucket, prefix + MANIFEST)
        names = [o.object_name for o in self._list(prefix)]
        # one DELETE per file, a few at a time: SeaweedFS answers a multi-object delete one object
        # after another (20-60 ms each under a run's load; `infra/log_keeper.py` `_delete`)
        with ThreadPoolExecutor(DELETERS) as pool:
            list(pool.map(lambda n: self._retry(f"remove {n}", self.client.remove_object, self.bucket, n), names))

    def gc(self, model: str, keep: int, versions: Iterable[int] | None = None) -> list[int]:
        """Delete all but the newest `keep` versions, and every version a kept delta version's chain
        needs (its full snapshot `meta["snapshot"]` and the deltas after it: `engine.delta`);
        returns the versions deleted.

        `versions`: the model's versions in the store, from a caller that tracks them (a trainer
        lists once, then adds what it publishes and drops what this deleted); None: listed here.
        Listing the model's prefix costs more as deleted versions pile up in the store (SeaweedFS
        keeps each deleted entry until its metadata store compacts: 8 ms -> 130 ms after 540
        versions of the CPU demo), so a trainer that listed each version slowed the whole loop."""
        if keep < 1:
            raise ValueError("keep must be >= 1")
        versions = sorted(versions) if versions is not None else self.list_versions(model)
        kept = versions[-keep:]
        oldest = min(kept, default=0)
        for v in kept:
            try:
                meta = self.read_manifest(model, v).meta
            except S3Error as e:  # deleted meanwhile (a restarted trainer's clean-up)
                if e.code != "NoSuchKey":
                    raise
                continue
            if "snapshot" in meta:
                oldest = min(oldest, int(meta["snapshot"]))
        old = [v for v in versions if v < oldest]
        for v in old:
            self.delete_version(model, v)
        return old

    def object_counts(self) -> dict[str, int]:
        """Objects per top-level prefix of the bucket (for `streamrft status`)."""
        counts: dict[str, int] = {}
        for obj in self._list(""):
            top = obj.object_name.split("/", 1)[0]
            counts[top] = counts.get(top, 0) + 1
        return counts
