"""Where the broker and the object store are, and the embedded stack that `streamrft up` starts."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from streamrft.config.base import _FINITE, _PORT, Section


class KafkaConfig(Section):
    bootstrap: str = "127.0.0.1:9092"
    """host:port list of the brokers."""
    security_protocol: Literal["PLAINTEXT", "SASL_PLAINTEXT", "SASL_SSL", "SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"] | None = None
    """SASL mechanism for an external cluster (teams authenticate with SCRAM)."""
    username: str | None = None
    password: str | None = None
    session_timeout_ms: int = Field(6000, ge=1)
    """Kept short: the embedded broker holds every JoinGroup reply for half of it."""
    heartbeat_interval_ms: int = Field(1000, ge=1)
    """Must be below `session_timeout_ms` (a member that heartbeats slower is evicted)."""
    socket_timeout_ms: int = Field(10000, ge=10, le=300000)
    """How long a client waits for the answer to one request before it gives up on the connection
    and opens a new one (librdkafka `socket.timeout.ms`, whose default is 60 s). A half-open
    connection (the broker or the network lost it without a reset) then costs seconds: the
    request is sent again on a fresh connection, and a producer's records are retried, not lost."""
    fetch_wait_ms: int = Field(100, ge=1, le=10000)
    """How long a fetch of the loop's data path (stream ops' rollouts, the trainer's experiences, the
    explorers' weights watcher) waits for new records. The embedded broker (Tansu) holds a fetch
    that finds nothing new for all of it, even when records arrive meanwhile, so each hop of the
    loop waits up to this long (with librdkafka's default 500 ms the CPU demo's trainer waited a
    median 0.50 s a step); each idle fetch costs the broker's S3 a few ms of CPU, so not much
    lower. (The explorers' admission log fetches every 100 ms, the other consumers every 500.)"""
    gap_wait_s: float = Field(10.0, ge=0, le=600)
    """How long a consumer waits for records missing from a partition's offsets (it read N, the
    broker then gave N+k) before taking them as empty (`infra/offset_gaps.py`), counted from the
    timestamp of the record past them: only a hole at the head of a live topic is waited for, a
    replay of an old log passes its empty offsets at once. The embedded broker
    lists a later batch before an earlier one when its S3 writes finish out of order (a loaded or
    restarting store), and its restarts leave offsets that no record fills; a consumer that moved
    on would never read the late records. 0 turns the
    check off: needed where producers use transactions (their markers take offsets no record fills)."""
    partitions: int = Field(4, ge=1)
    """Partitions of the run's rollouts and experiences topics (the unit of stream-ops scaling)."""
    replication_factor: int = Field(1, ge=1)
    retention_ms: int = -1
    """-1 keeps every record forever: the durable, replayable log of every trajectory; else > 0."""
    idempotence: bool = False
    """Idempotent producers (librdkafka `enable.idempotence`). Off by default: the embedded broker
    (Tansu 0.6) acknowledges a retried batch it never stored when it is killed mid-produce, losing
    acked records (measured: 1-7 of ~400 over 12 kill -9s; none with idempotence off). Off, a
    producer keeps order with one request in flight and may deliver a record twice after a
    failure, which every streamrft consumer tolerates (the trainer dedups by trajectory id). On an
    Apache Kafka cluster turn it on."""
    extra: dict[str, Any] = Field(default_factory=dict)
    """Extra librdkafka properties passed through to every client."""

    @field_validator("retention_ms")
    @classmethod
    def _retention(cls, v: int) -> int:
        if v != -1 and v <= 0:  # 0 would have Kafka delete every record at once
            raise ValueError(f"must be -1 (keep forever) or > 0 (got {v})")
        return v

    @model_validator(mode="after")
    def _heartbeat(self) -> "KafkaConfig":
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ValueError(f"heartbeat_interval_ms ({self.heartbeat_interval_ms}) must be < "
                             f"session_timeout_ms ({self.session_timeout_ms})")
        return self


class S3Config(Section):
    endpoint: str = "127.0.0.1:8333"
    """host:port of the S3 (MinIO API) endpoint."""
    access_key: str = "streamrft"
    secret_key: str = "streamrft"
    secure: bool = False
    region: str = "us-east-1"
    bucket: str = "weights"
    """Bucket holding weight versions."""
    timeout_s: float = Field(15.0, gt=0, **_FINITE)
    """One S3 request's limit to connect, and to wait for each read of its answer: a half-open
    connection (the store accepts, then never answers) fails after this and is retried, rather
    than holding an upload or a fetch for minutes. The store's retry budget bounds all the tries."""


class LogKeeperConfig(Section):
    """The embedded stack's log keeper (`infra/log_keeper.py`): it rolls the broker's small batch
    objects (one per produce request) up into large ones, since the broker lists all of a
    partition's objects on every fetch."""
    enabled: bool = True
    every_s: float = Field(2.0, gt=0, le=3600)
    """Seconds between two passes over every partition."""
    min_age_s: float = Field(3.0, ge=0, le=86400)
    """Objects younger than this are left alone. A hole (a request whose offsets the broker gave
    out and whose object is not written or listed yet) never ends up inside a merged object, at any
    age: a merge stops at a batch that does not follow the one before it."""
    target_bytes: int = Field(1 << 20, ge=1024, le=64 << 20)
    """Size of a merged object (a fetch returns at least one whole object)."""
    settled_after_s: float = Field(120.0, ge=0, le=86400)
    """Objects older than this are settled: the readers at the log's tail are past them, and the
    keeper merges them again, into objects of up to `settled_bytes`."""
    settled_bytes: int = Field(16 << 20, ge=1024, le=64 << 20)
    """Size of a merged settled object: a partition that grows by a GiB an hour keeps ~64 of them,
    not ~1,000 objects of `target_bytes`, each listed by every fetch."""
    min_run: int = Field(8, ge=2)
    """A partition is rolled up once it holds at least this many small old objects."""


FILER_STORES = ("leveldb2", "sqlite")
"""SeaweedFS metadata stores the embedded stack can start with (`infra/stack.py` `filer_toml`)."""


class StackConfig(Section):
    embedded: bool = True
    """Start the embedded broker + S3 server (`streamrft up`); false = use `kafka`/`s3` as given."""
    data_dir: str = ".streamrft/stack"
    host: str = "127.0.0.1"
    kafka_port: int = Field(9092, **_PORT)
    s3_port: int = Field(8333, **_PORT)
    weed_port_base: int = Field(19400, ge=1, le=65535 - 8)
    """First of the 9 internal SeaweedFS ports (master, volume, filer, admin and their gRPC ports)."""
    log_keeper: LogKeeperConfig = Field(default_factory=LogKeeperConfig)
    filer_store: Literal[FILER_STORES] = "sqlite"
    """SeaweedFS's metadata store, chosen when the data dir is made (an existing one keeps its own,
    and `streamrft up` names it): `sqlite` keeps no tombstones for the listings the broker makes on
    every fetch, so a run keeps its speed for hours; `leveldb2` (weed's own default, and ours before
    2026-12) serves the first minutes faster and slows as the run ages (`infra/stack.py`
    `filer_toml`, docs/broker-growth.md)."""


class RestartConfig(Section):
    """`restarts:`: how `streamrft run` restarts a role that exits non-zero (`launch/restarts.py`).
    A role is restarted at most `max_restarts` times within any `window_s` seconds; the first
    restart in a window is at once, each later one waits twice the one before (from `backoff_s`,
    at most `max_backoff_s`). One failure more in the window ends the run, naming the role's log."""

    max_restarts: int = Field(5, ge=0)
    """0 = never restart: the first failure of any role ends the run."""
    window_s: float = Field(600.0, gt=0, **_FINITE)
    backoff_s: float = Field(1.0, ge=0, **_FINITE)
    max_backoff_s: float = Field(30.0, ge=0, **_FINITE)
