"""The embedded stack's log keeper: a partition written by thousands of produce requests stays a few
objects long, and every record reads back once, in order, from the start and from the tail.

The embedded broker lists all of a partition's objects on every fetch (one S3 list request per
1,000 objects), so the count that matters is objects per partition: it bounds the S3 requests each
fetch makes. Checked on the session's real stack, whose keeper runs as its own process.
"""
from __future__ import annotations

import json
import time

from confluent_kafka import TopicPartition
from minio import Minio

from streamrft.infra.kafka import ensure_topics, flush_or_raise, make_consumer, make_producer, read_topic, run_topics
from streamrft.infra.log_keeper import LogKeeper, _Bytes
from streamrft.infra.segments import merge, parse_batch
from streamrft.infra.stack import S3_KEY, TANSU_BUCKET
from streamrft.schemas import topic_name

RECORDS, PER_REQUEST = 50_000, 10


def _tansu(stack) -> Minio:
    return Minio(stack.state.s3, access_key=S3_KEY, secret_key=S3_KEY, secure=False)


def _objects(client: Minio, topic: str) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for o in client.list_objects(TANSU_BUCKET, prefix=f"clusters/tansu_cluster/topics/{topic}/", recursive=True):
        if o.object_name.endswith(".batch"):
            out.setdefault(int(o.object_name.split("/partitions/")[1][:10]), []).append(o.object_name)
    return out


def test_fifty_thousand_records_in_five_thousand_requests_read_back_whole_from_few_objects(stack, namespace):
    kafka = stack.kafka.model_copy(update={"partitions": 2})
    topic = topic_name(namespace, "experiences")
    ensure_topics(kafka, {topic: run_topics(kafka, namespace)[topic]})
    producer = make_producer(kafka)
    for i in range(RECORDS):  # the loop's own producer, flushed every 10 records: 5,000 requests
        producer.produce(topic, key=b"g%d" % (i % 2), value=b"%06d" % i + b"x" * 120, partition=i % 2)
        if i % (2 * PER_REQUEST) == 2 * PER_REQUEST - 1:
            flush_or_raise(producer)
    flush_or_raise(producer)
    client = _tansu(stack)
    # the keeper rolls up what is older than its min age, every few seconds
    deadline = time.monotonic() + 180
    while max(len(v) for v in _objects(client, topic).values()) > 20 and time.monotonic() < deadline:
        time.sleep(2)
    objects = _objects(client, topic)
    # 25,000 records of ~130 B a partition: ~3.3 MB in 1 MB objects, plus the newest few left as they are
    assert all(len(v) <= 20 for v in objects.values()), {p: len(v) for p, v in objects.items()}

    got = read_topic(kafka, topic, deadline_s=120)
    by_partition: dict[int, list[int]] = {0: [], 1: []}
    for m in got:
        by_partition[m.partition()].append(m.offset())
        assert int(m.value()[:6]) % 2 == m.partition()
    assert by_partition == {0: list(range(RECORDS // 2)), 1: list(range(RECORDS // 2))}  # each once, in order

    # a new consumer group starts at `earliest`: still offset 0 of each partition (the broker answers
    # it with its oldest object, which the keeper never merges away)
    group = make_consumer(kafka, f"{namespace}-new-group")
    try:
        group.subscribe([topic])
        firsts: dict[int, int] = {}
        for _ in range(60):  # (one partition's 25,000 records may come before the other's first)
            for m in group.consume(10000, timeout=1.0):
                if m.error() is None:
                    firsts.setdefault(m.partition(), m.offset())
            if len(firsts) == 2:
                break
        assert firsts == {0: 0, 1: 0}
    finally:
        group.close()

    # a consumer at the tail reads the newest records in its first fetches
    consumer = make_consumer(kafka, None)
    try:
        consumer.assign([TopicPartition(topic, p, RECORDS // 2 - 100) for p in (0, 1)])
        tail, polls = [], 0
        while len(tail) < 200 and polls < 20:
            tail += [m for m in consumer.consume(1000, timeout=1.0) if m.error() is None]
            polls += 1
        assert sorted(int(m.value()[:6]) for m in tail) == list(range(RECORDS - 200, RECORDS))
    finally:
        consumer.close()


def test_a_roll_up_cut_between_its_write_and_its_delete_is_finished_by_the_next_pass(stack, namespace):
    kafka = stack.kafka.model_copy(update={"partitions": 1})
    topic = topic_name(namespace, "metrics")
    ensure_topics(kafka, {topic: run_topics(kafka, namespace)[topic]})
    producer = make_producer(kafka)
    for i in range(6):
        producer.produce(topic, key=b"k", value=b"%d" % i)
        flush_or_raise(producer)  # one object each
    client = _tansu(stack)
    names = sorted(_objects(client, topic)[0])
    assert len(names) == 6
    # what a keeper killed after its write leaves: the journal, the merged object over the first,
    # and the originals it was about to delete
    keeper = LogKeeper(client, journal=f"test-journals/{namespace}.json")  # not the stack keeper's own
    batches = [parse_batch(keeper._read(n), int(n.rsplit("/", 1)[1][:20])) for n in names[:4]]
    journal = json.dumps({"first": names[0], "last_offset": 3, "rest": names[1:4]}).encode()
    client.put_object(TANSU_BUCKET, keeper.journal, _Bytes(journal), len(journal))
    data = merge(batches)
    client.put_object(TANSU_BUCKET, names[0], _Bytes(data), len(data))
    keeper.finish_pending()
    assert sorted(_objects(client, topic)[0]) == [names[0], *names[4:]]
    assert [m.value() for m in read_topic(kafka, topic)] == [b"%d" % i for i in range(6)]


def test_a_journal_whose_write_never_happened_deletes_nothing(stack, namespace):
    kafka = stack.kafka.model_copy(update={"partitions": 1})
    topic = topic_name(namespace, "metrics")
    ensure_topics(kafka, {topic: run_topics(kafka, namespace)[topic]})
    producer = make_producer(kafka)
    for i in range(3):
        producer.produce(topic, key=b"k", value=b"%d" % i)
        flush_or_raise(producer)
    client = _tansu(stack)
    names = sorted(_objects(client, topic)[0])
    journal = json.dumps({"first": names[0], "last_offset": 2, "rest": names[1:]}).encode()
    keeper = LogKeeper(client, journal=f"test-journals/{namespace}.json")
    client.put_object(TANSU_BUCKET, keeper.journal, _Bytes(journal), len(journal))
    keeper.finish_pending()  # killed before the merged write: the originals are the only copies
    assert sorted(_objects(client, topic)[0]) == names
    assert [m.value() for m in read_topic(kafka, topic)] == [b"0", b"1", b"2"]


def test_a_merge_never_spans_a_hole_the_broker_has_not_written_yet(stack, namespace):
    kafka = stack.kafka.model_copy(update={"partitions": 1})
    topic = topic_name(namespace, "metrics")
    ensure_topics(kafka, {topic: run_topics(kafka, namespace)[topic]})
    producer = make_producer(kafka)
    for i in range(7):  # fewer than the stack keeper's min_run: it leaves them alone
        producer.produce(topic, key=b"k", value=b"%d" % i)
        flush_or_raise(producer)  # one object each, offsets 0..6
    client = _tansu(stack)
    names = sorted(_objects(client, topic)[0])
    assert len(names) == 7
    # offset 3's request: its offsets given out, its object not written yet (or not listed yet)
    late = LogKeeper(client, journal=f"test-journals/{namespace}.json", min_age_s=0, min_run=2)
    held = late._read(names[3])
    client.remove_object(TANSU_BUCKET, names[3])
    prefix = names[0][:names[0].index("/records/") + len("/records/")]
    late.roll_up(prefix, now=time.time() + 60)
    # the first and the newest stay; 1-2 and 4-5 merge on each side of the hole, never across it
    assert sorted(_objects(client, topic)[0]) == [names[0], names[1], names[4], names[6]]
    client.put_object(TANSU_BUCKET, names[3], _Bytes(held), len(held))  # the late write lands
    assert [m.value() for m in read_topic(kafka, topic)] == [b"%d" % i for i in range(7)]


def test_the_rest_after_a_pass_grows_with_its_listing_not_its_merging():
    from streamrft.infra.log_keeper import DUTY_REST, KeeperStats, rest_after

    assert rest_after(KeeperStats(list_s=0.1), every_s=5.0) == 5.0  # a run's broker: every `every_s`
    assert rest_after(KeeperStats(list_s=2.0), every_s=5.0) == DUTY_REST * 2.0  # many topics: a longer rest
    merged_long = KeeperStats(list_s=0.2, merged_objects=7161)  # a pass that merged for minutes
    assert rest_after(merged_long, every_s=5.0) == 5.0


def _objs(*spec: tuple[int, float]) -> list:
    """Objects of (size in KiB, age in s), at offsets 0, 10, 20, ..."""
    from streamrft.infra.log_keeper import _Obj

    return [_Obj(f"p/records/{10 * i:020d}.batch", 10 * i, kib << 10, 1000.0 - age) for i, (kib, age) in enumerate(spec)]


def _bases(runs) -> list[list[int]]:
    return [[o.base for o in r] for r in runs]


def test_a_pass_merges_small_objects_into_the_target_and_settled_ones_into_the_settled_size():
    keeper = LogKeeper(None, min_age_s=3, target_bytes=1 << 20, min_run=2, settled_after_s=120, settled_bytes=4 << 20)
    # first | three small, old | two full 1 MiB, not settled yet | young small | newest
    objs = _objs((100, 500), (100, 50), (100, 40), (100, 30), (1024, 100), (1024, 90), (100, 1), (5, 0))
    assert _bases(keeper.plan(objs, now=1000.0)) == [[10, 20, 30]]
    # the same 1 MiB objects once settled: a run of 2 MiB makes half of 4 MiB, so it merges
    objs = _objs((100, 500), (1024, 300), (1024, 200), (100, 1), (5, 0))
    assert _bases(keeper.plan(objs, now=1000.0)) == [[10, 20]]
    # settled objects of 1,400 and 600 KiB: under 2 MiB together, so they wait for more
    objs = _objs((100, 500), (1400, 300), (600, 200), (5, 0))
    assert keeper.plan(objs, now=1000.0) == []
    # settled runs stop at 4 MiB; a small object between them breaks the tier; a 2 MiB one is full
    objs = _objs((100, 500), (1500, 400), (1500, 390), (1500, 380), (1500, 370), (200, 360), (300, 350),
                 (2048, 340), (1500, 330), (1500, 320), (5, 0))
    assert _bases(keeper.plan(objs, now=1000.0)) == [[10, 20], [30, 40], [50, 60], [80, 90]]
    # fewer small objects than min_run: only the settled run merges
    keeper.min_run = 3
    assert _bases(keeper.plan(objs, now=1000.0)) == [[10, 20], [30, 40], [80, 90]]


def test_settled_objects_merge_again_and_every_record_reads_back_in_order(stack, namespace):
    kafka = stack.kafka.model_copy(update={"partitions": 1})
    topic = topic_name(namespace, "experiences")
    ensure_topics(kafka, {topic: run_topics(kafka, namespace)[topic]})
    producer = make_producer(kafka)
    for i in range(7):  # one 600 KB record a request: full 1 MiB-tier objects, which the stack's keeper
        # leaves alone until settled, and then until they make 8 MiB
        producer.produce(topic, key=b"k", value=b"%06d" % i + bytes([i]) * 600_000)
        flush_or_raise(producer)
    client = _tansu(stack)
    names = sorted(_objects(client, topic)[0])
    assert len(names) == 7
    keeper = LogKeeper(client, journal=f"test-journals/{namespace}.json", min_age_s=0, settled_after_s=0,
                       settled_bytes=4 << 20)
    prefix = names[0][:names[0].index("/records/") + len("/records/")]
    assert keeper.roll_up(prefix, now=time.time() + 1) == 3
    # the first and the newest stay; the five between are one object of ~3 MB
    assert sorted(_objects(client, topic)[0]) == [names[0], names[1], names[6]]
    got = read_topic(kafka, topic, deadline_s=60)
    assert [(m.offset(), m.value()[:6]) for m in got] == [(i, b"%06d" % i) for i in range(7)]
    assert all(m.value()[6:] == bytes([i]) * 600_000 for i, m in enumerate(got))
    # and through aiokafka, as faust reads (its default: 1 MiB a partition a fetch; the broker hands
    # over the whole ~3 MB object, as Kafka does a batch larger than the limit)
    import asyncio

    from aiokafka import AIOKafkaConsumer, TopicPartition as AioPartition

    async def read_all() -> list:
        consumer = AIOKafkaConsumer(bootstrap_servers=kafka.bootstrap, enable_auto_commit=False,
                                    max_partition_fetch_bytes=1 << 20)
        await consumer.start()
        try:
            tp = AioPartition(topic, 0)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            out: list = []
            deadline = time.monotonic() + 60
            while len(out) < 7 and time.monotonic() < deadline:
                for records in (await consumer.getmany(tp, timeout_ms=1000)).values():
                    out.extend(records)
            return out
        finally:
            await consumer.stop()

    got = asyncio.run(read_all())
    assert [(m.offset, m.value[:6]) for m in got] == [(i, b"%06d" % i) for i in range(7)]
