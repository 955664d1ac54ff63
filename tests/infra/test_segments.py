"""Record batches as the embedded broker stores them, and merging them (`infra/segments.py`).

The bytes are worked out by hand from Kafka's record batch format (magic 2): a 61-byte header,
then each record as a zigzag-varint length, attributes, timestamp delta, offset delta, key, value
and header count.
"""
from __future__ import annotations

import struct

import crc32c
import pytest

from streamrft.infra.segments import BatchError, Record, encode_batch, merge, parse_batch, records


def test_crc32c_is_the_castagnoli_polynomial():
    assert crc32c.crc32c(b"123456789") == 0xE3069283  # the standard check value


def _batch(base: int, ts: int, key: bytes, value: bytes, attributes: int = 0, pid: int = -1) -> bytes:
    """One single-record batch, assembled field by field (what a producer sends for one record)."""
    rec = bytes([0, 0, 0, 2 * len(key)]) + key + bytes([2 * len(value)]) + value + bytes([0])
    body = bytes([2 * len(rec)]) + rec
    after = struct.pack(">hiqqqhii", attributes, 0, ts, ts, pid, -1, -1, 1) + body
    return struct.pack(">qiiBI", base, len(after) + 9, 0, 2, crc32c.crc32c(after)) + after


def test_one_record_batch_reads_back_and_re_encodes_byte_for_byte():
    raw = _batch(0, 1000, b"k", b"v")
    # record: attrs 0, ts delta 0, offset delta 0, key len 1 (zigzag 2) 'k', value len 1 'v', 0 headers
    assert raw[61:] == bytes.fromhex("10" "00" "00" "00" "02" "6b" "02" "76" "00")
    b = parse_batch(raw, base_offset=7)  # the broker names the object by its offset; the stored base is 0
    assert (b.base_offset, b.count, b.last_offset, b.mergeable) == (7, 1, 7, True)
    (r,) = records(b)
    assert (r.offset, r.timestamp, r.tail) == (7, 1000, bytes.fromhex("026b027600"))
    assert encode_batch([r])[8:] == raw[8:]  # same bytes but the base offset


def test_merge_rewrites_each_records_deltas_against_the_new_base():
    a = parse_batch(_batch(0, 1000, b"k", b"v"), base_offset=5)
    b = parse_batch(_batch(0, 1003, b"k2", b"w"), base_offset=6)
    merged = merge([a, b])
    m = parse_batch(merged)  # checks the CRC
    assert (m.base_offset, m.count, m.last_offset_delta, m.base_timestamp, m.max_timestamp) == (5, 2, 1, 1000, 1003)
    assert (m.producer_id, m.producer_epoch, m.base_sequence) == (-1, -1, -1)
    # second record: ts delta 3 (zigzag 06), offset delta 1 (zigzag 02)
    assert m.records == bytes.fromhex("10" "00" "00" "00" "026b027600") + bytes.fromhex("12" "00" "06" "02" "046b32027700")
    assert [(r.offset, r.timestamp) for r in records(m)] == [(5, 1000), (6, 1003)]


def test_offsets_with_gaps_survive_a_merge():
    a = parse_batch(_batch(0, 10, b"a", b"1"), base_offset=0)
    b = parse_batch(_batch(0, 20, b"b", b"2"), base_offset=9)  # 1..8: offsets no record filled
    m = parse_batch(merge([a, b]))
    assert [r.offset for r in records(m)] == [0, 9] and m.last_offset == 9


@pytest.mark.parametrize("attributes", [1, 0x10, 0x20])  # gzip, transactional, control
def test_compressed_transactional_and_control_batches_are_not_merged(attributes):
    b = parse_batch(_batch(0, 1, b"k", b"v", attributes=attributes))
    assert not b.mergeable
    with pytest.raises(BatchError):
        merge([b, b])


def test_corrupt_bytes_are_refused():
    raw = bytearray(_batch(0, 1, b"k", b"v"))
    with pytest.raises(BatchError, match="CRC"):
        parse_batch(bytes(raw[:-1]) + b"\x01")
    with pytest.raises(BatchError, match="length"):
        parse_batch(bytes(raw) + b"\x00")
    raw[16] = 1  # magic
    with pytest.raises(BatchError, match="magic"):
        parse_batch(bytes(raw))
    with pytest.raises(BatchError, match="shorter"):
        parse_batch(b"\x00" * 10)


def test_offsets_must_ascend():
    with pytest.raises(BatchError, match="ascend"):
        encode_batch([Record(3, 0, 0, b"\x00\x00\x00"), Record(3, 0, 0, b"\x00\x00\x00")])
