"""Health, topics with true per-partition end offsets, consumer groups with lag, bucket counts.

Used by `streamrft status` and by the run's progress view. End offsets come from
`partition_ends`, which is right on Apache Kafka and on the embedded broker alike.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from confluent_kafka import ConsumerGroupTopicPartitions

from streamrft.config import KafkaConfig, S3Config
from streamrft.infra.kafka import make_admin, partition_ends
from streamrft.infra.objectstore import make_client


@dataclass
class GroupLag:
    group: str
    topic: str
    committed: dict[int, int]
    lag: dict[int, int]

    @property
    def total_lag(self) -> int:
        return sum(self.lag.values())


@dataclass
class Status:
    kafka_ok: bool
    s3_ok: bool
    topics: dict[str, list[tuple[int, int, int]]] = field(default_factory=dict)  # name -> [(p, start, end)]
    groups: list[GroupLag] = field(default_factory=list)
    buckets: dict[str, int] = field(default_factory=dict)
    gateway: dict[str, dict[str, float]] = field(default_factory=dict)  # "<gateway>:<team>" -> counters
    errors: list[str] = field(default_factory=list)


def topic_ends(kafka: KafkaConfig, prefix: str = "") -> dict[str, list[tuple[int, int, int]]]:
    admin = make_admin(kafka)
    names = sorted(t for t in admin.list_topics(timeout=10).topics if not t.startswith("__") and t.startswith(prefix))
    return {t: [(e.partition, e.start, e.end) for e in partition_ends(kafka, t)] for t in names}


def group_lags(kafka: KafkaConfig, topics: dict[str, list[tuple[int, int, int]]]) -> list[GroupLag]:
    admin = make_admin(kafka)
    groups = sorted(g.group_id for g in admin.list_consumer_groups(request_timeout=10).result().valid)
    out = []
    for g in groups:
        res = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(g)], request_timeout=10)
        committed: dict[str, dict[int, int]] = {}
        for tp in res[g].result().topic_partitions or []:
            if tp.offset >= 0:
                committed.setdefault(tp.topic, {})[tp.partition] = tp.offset
        for topic, offs in sorted(committed.items()):
            ends = {p: end for p, _, end in topics.get(topic, [])}
            lag = {p: max(ends.get(p, o) - o, 0) for p, o in offs.items()}
            # partitions with records but no commit yet lag by everything since their start
            for p, start, end in topics.get(topic, []):
                if p not in offs:
                    lag[p] = end - start
            out.append(GroupLag(g, topic, offs, lag))
    return out


def gateway_counters(kafka: KafkaConfig, namespace: str) -> dict[str, dict[str, float]]:
    """The newest counters each gateway published per team on `<namespace>.metrics`."""
    from confluent_kafka import TopicPartition

    from streamrft.infra.kafka import decoded, make_consumer
    from streamrft.schemas import Metric, topic_name

    topic = topic_name(namespace, "metrics")
    ends = partition_ends(kafka, topic)
    consumer = make_consumer(kafka, None)
    consumer.assign([TopicPartition(topic, e.partition, e.start) for e in ends])
    left, out = {e.partition: e.end for e in ends if e.end > e.start}, {}
    try:
        while left:
            msgs = consumer.consume(1000, timeout=1.0)
            if not msgs:
                break
            for m, metric in decoded(msgs, topic, Metric):
                if metric.role == "gateway" and ":" in metric.role_id:
                    out[metric.role_id] = metric.values
            for m in msgs:
                if m.error() is None and m.offset() + 1 >= left.get(m.partition(), 0):
                    left.pop(m.partition(), None)
    finally:
        consumer.close()
    return out


def bucket_counts(s3: S3Config, buckets: list[str]) -> dict[str, int]:
    client = make_client(s3)
    return {b: sum(1 for _ in client.list_objects(b, recursive=True)) if client.bucket_exists(b) else -1
            for b in buckets}


def collect(kafka: KafkaConfig, s3: S3Config, buckets: list[str], topic_prefix: str = "",
            namespace: str | None = None) -> Status:
    """`namespace` also reads that run's gateway counters."""
    st = Status(kafka_ok=False, s3_ok=False)
    try:
        st.topics = topic_ends(kafka, topic_prefix)
        st.groups = group_lags(kafka, st.topics)
        if namespace and f"{namespace}.metrics" in st.topics:
            st.gateway = gateway_counters(kafka, namespace)
        st.kafka_ok = True
    except Exception as e:  # report, don't crash: status is how people find out what is down
        st.errors.append(f"kafka {kafka.bootstrap}: {e}")
    try:
        st.buckets = bucket_counts(s3, buckets)
        st.s3_ok = True
    except Exception as e:
        st.errors.append(f"s3 {s3.endpoint}: {e}")
    return st


def render(st: Status) -> str:
    lines = [f"kafka: {'ok' if st.kafka_ok else 'DOWN'}   s3: {'ok' if st.s3_ok else 'DOWN'}"]
    lines.append("topics:")
    for t, parts in st.topics.items():
        total = sum(end - start for _, start, end in parts)
        lines.append(f"  {t:<40} records={total:<8} ends=" + " ".join(f"p{p}:{end}" for p, _, end in parts))
    lines.append("consumer groups:")
    for g in st.groups:
        lines.append(f"  {g.group:<30} {g.topic:<34} lag={g.total_lag:<7} committed="
                     + " ".join(f"p{p}:{o}" for p, o in sorted(g.committed.items())))
    lines.append("buckets:")
    for b, n in st.buckets.items():
        lines.append(f"  {b:<20} objects={n if n >= 0 else 'missing'}")
    if st.gateway:
        lines.append("gateway teams:")
        for who, v in sorted(st.gateway.items()):
            team = who.rsplit(":", 1)[1]
            lines.append(f"  {team:<16} episodes={int(v.get('episodes_finished', 0))} open={int(v.get('open_episodes', 0))} "
                         f"expired={int(v.get('episodes_expired', 0))} groups={int(v.get('groups_published', 0))} "
                         f"tokens={int(v.get('prompt_tokens', 0))}+{int(v.get('completion_tokens', 0))} "
                         f"429={int(v.get('rejected_admission', 0) + v.get('rejected_stale', 0))}  ({who.rsplit(':', 1)[0]})")
    lines += [f"error: {e}" for e in st.errors]
    return "\n".join(lines)
