"""The embedded stack's metadata store (`stack.filer_store`, sqlite by default): a data dir keeps the
store it was made with, so one made with leveldb2 (the default before) keeps working, and `up` says
which store a data dir uses."""
from __future__ import annotations

import io

import pytest
from minio import Minio

from streamrft.cli import filer_store_line
from streamrft.config import KafkaConfig, StackConfig
from streamrft.infra.kafka import (
    ensure_topics,
    flush_or_raise,
    make_producer,
    read_topic,
    run_topics,
)
from streamrft.infra.stack import (
    S3_KEY,
    EmbeddedStack,
    StackError,
    filer_toml,
    free_ports,
)
from streamrft.schemas import topic_name


def test_filer_toml_names_the_store_and_refuses_others(tmp_path):
    assert filer_toml("leveldb2", tmp_path) is None  # weed's default: no file
    toml = filer_toml("sqlite", tmp_path)
    assert "[sqlite]\nenabled = true" in toml and "[leveldb2]\nenabled = false" in toml
    assert f"file:{tmp_path / 'filer.db'}?" in toml and "journal_mode(WAL)" in toml
    with pytest.raises(StackError, match=r"stack.filer_store='redis': must be one of \['leveldb2', 'sqlite'\]"):
        filer_toml("redis", tmp_path)


def test_a_sqlite_stack_keeps_its_store_and_its_objects_across_a_restart_asking_for_another(tmp_path):
    ports = free_ports()
    es = EmbeddedStack(tmp_path, filer_store="sqlite", log_keeper={"enabled": False}, **ports)
    try:
        state = es.up()
        assert (tmp_path / "s3" / "filer.db").exists() and not (tmp_path / "s3" / "filerldb2").exists()
        client = Minio(state.s3, access_key=S3_KEY, secret_key=S3_KEY, secure=False)
        client.put_object("weights", "m/v1/a.bin", io.BytesIO(b"abc"), 3)
        kafka = KafkaConfig(bootstrap=state.kafka, partitions=1)
        topic = topic_name("filer-store", "metrics")
        ensure_topics(kafka, {topic: run_topics(kafka, "filer-store")[topic]})
        producer = make_producer(kafka)
        for i in range(3):
            producer.produce(topic, key=b"k", value=b"%d" % i)
            flush_or_raise(producer)
        client.remove_object("weights", "m/v1/a.bin")
        client.put_object("weights", "m/v2/a.bin", io.BytesIO(b"def"), 3)
    finally:
        es.down()
    # started again by a config that asks for leveldb2: the dir was made with sqlite, and keeps it
    es = EmbeddedStack(tmp_path, filer_store="leveldb2", log_keeper={"enabled": False}, **ports)
    try:
        state = es.up()
        assert "[sqlite]\nenabled = true" in (tmp_path / "filer.toml").read_text()
        client = Minio(state.s3, access_key=S3_KEY, secret_key=S3_KEY, secure=False)
        assert [o.object_name for o in client.list_objects("weights", prefix="m/", recursive=True)] == ["m/v2/a.bin"]
        kafka = KafkaConfig(bootstrap=state.kafka, partitions=1)
        assert [m.value() for m in read_topic(kafka, topic_name("filer-store", "metrics"))] == [b"0", b"1", b"2"]
    finally:
        es.down()


def test_a_data_dir_made_with_the_old_default_keeps_leveldb2_under_the_new_one(tmp_path):
    assert StackConfig().filer_store == "sqlite" and EmbeddedStack(tmp_path).filer_store == "sqlite"
    ports = free_ports()
    es = EmbeddedStack(tmp_path, filer_store="leveldb2", log_keeper={"enabled": False}, **ports)
    assert es.filer_store_made_with() is None
    try:
        state = es.up()
        client = Minio(state.s3, access_key=S3_KEY, secret_key=S3_KEY, secure=False)
        client.put_object("weights", "m/v1/a.bin", io.BytesIO(b"abc"), 3)
    finally:
        es.down()
    es = EmbeddedStack(tmp_path, log_keeper={"enabled": False}, **ports)  # the new default asks for sqlite
    assert es.filer_store_made_with() == "leveldb2" and es.filer_store_in_use() == "leveldb2"
    line = filer_store_line(es, "sqlite")
    assert line.startswith("store leveldb2 (") and "a data dir made anew uses sqlite" in line
    try:
        state = es.up()
        assert not (tmp_path / "filer.toml").exists() and not (tmp_path / "s3" / "filer.db").exists()
        client = Minio(state.s3, access_key=S3_KEY, secret_key=S3_KEY, secure=False)
        assert [o.object_name for o in client.list_objects("weights", prefix="m/", recursive=True)] == ["m/v1/a.bin"]
    finally:
        es.down()


def test_up_names_a_kept_store_that_is_not_the_one_asked_for(tmp_path):
    (tmp_path / "s3").mkdir()
    (tmp_path / "s3" / "filer.db").write_bytes(b"")
    es = EmbeddedStack(tmp_path, filer_store="leveldb2")
    assert filer_store_line(es, "leveldb2") == ("store sqlite (SeaweedFS metadata, fixed when the data dir was "
                                                "made); stack.filer_store: leveldb2 applies to a new data dir only")
