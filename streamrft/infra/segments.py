"""Kafka record batches (magic 2) as the embedded broker stores them, and merging many into one.

Tansu 0.6 on S3 writes every produce request as one object holding one record batch in Kafka's
wire format, named by its base offset; its fetch lists all of a partition's objects each time
(`log_keeper.py` rolls small ones up into large ones). A merged batch keeps every record's
offset, timestamp, key, value and headers; only the deltas are rewritten against the new base.
Compressed, transactional and control batches are never merged (`mergeable`): they stay as they
are, as the boundaries of the runs around them. A merged batch carries no producer id (-1), as a
non-idempotent producer's does: its records were acknowledged long before.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

import crc32c

HEADER = struct.Struct(">qiiBIhiqqqhii")  # base offset .. record count: 61 bytes
CRC_FROM = 21  # the CRC covers attributes (byte 21) to the end
MAGIC = 2
ATTR_COMPRESSION, ATTR_TRANSACTIONAL, ATTR_CONTROL = 0x07, 0x10, 0x20


class BatchError(ValueError):
    """Bytes that are not one well-formed magic-2 record batch."""


@dataclass(frozen=True)
class Batch:
    base_offset: int
    leader_epoch: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    count: int
    records: bytes  # the records section, as stored

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def mergeable(self) -> bool:
        return not self.attributes & (ATTR_COMPRESSION | ATTR_TRANSACTIONAL | ATTR_CONTROL)


def parse_batch(data: bytes, base_offset: int | None = None, check_crc: bool = True) -> Batch:
    """One stored batch; `base_offset` overrides the stored one (the broker takes it from the
    object's name). Raises `BatchError` for anything else, a CRC mismatch included."""
    if len(data) < HEADER.size:
        raise BatchError(f"{len(data)} bytes is shorter than a batch header ({HEADER.size})")
    (base, length, epoch, magic, crc, attrs, last_delta, base_ts, max_ts, pid, pepoch, bseq,
     count) = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise BatchError(f"magic {magic}, only {MAGIC} is supported")
    if length != len(data) - 12:
        raise BatchError(f"batch length {length} does not match the {len(data) - 12} bytes after it")
    if check_crc and crc32c.crc32c(data[CRC_FROM:]) != crc:
        raise BatchError("CRC mismatch")
    return Batch(base if base_offset is None else base_offset, epoch, attrs, last_delta, base_ts, max_ts,
                 pid, pepoch, bseq, count, bytes(data[HEADER.size:]))


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if pos >= len(buf):
            raise BatchError("record truncated inside a varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return (result >> 1) ^ -(result & 1), pos  # zigzag
        shift += 7
        if shift > 63:
            raise BatchError("varint longer than 10 bytes")


def _varint(v: int) -> bytes:
    z = (v << 1) ^ (v >> 63)
    z &= (1 << 64) - 1
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


@dataclass(frozen=True)
class Record:
    offset: int
    timestamp: int
    attributes: int
    tail: bytes  # key, value and headers, as stored


def records(batch: Batch) -> list[Record]:
    """The batch's records with absolute offsets and timestamps (uncompressed batches only)."""
    if batch.attributes & ATTR_COMPRESSION:
        raise BatchError("compressed batch")
    buf, pos, out = batch.records, 0, []
    for _ in range(batch.count):
        length, pos = _read_varint(buf, pos)
        end = pos + length
        if length < 3 or end > len(buf):
            raise BatchError(f"record length {length} runs past the batch")
        attrs = buf[pos]
        ts_delta, p = _read_varint(buf, pos + 1)
        off_delta, p = _read_varint(buf, p)
        if p > end:
            raise BatchError("record header runs past its length")
        out.append(Record(batch.base_offset + off_delta, batch.base_timestamp + ts_delta, attrs, buf[p:end]))
        pos = end
    if pos != len(buf):
        raise BatchError(f"{len(buf) - pos} bytes after the last of {batch.count} records")
    return out


def encode_batch(recs: list[Record], leader_epoch: int = 0) -> bytes:
    """One uncompressed, non-transactional batch of `recs` (ascending offsets), based at the first."""
    if not recs:
        raise BatchError("a batch needs at least one record")
    base, base_ts = recs[0].offset, min(r.timestamp for r in recs)
    body = bytearray()
    last = base - 1
    for r in recs:
        if r.offset <= last:
            raise BatchError(f"offset {r.offset} after {last}: offsets must ascend")
        last = r.offset
        rec = bytes([r.attributes]) + _varint(r.timestamp - base_ts) + _varint(r.offset - base) + r.tail
        body += _varint(len(rec)) + rec
    after_crc = struct.pack(">hiqqqhii", 0, last - base, base_ts, max(r.timestamp for r in recs),
                            -1, -1, -1, len(recs)) + bytes(body)
    head = struct.pack(">qiiBI", base, len(after_crc) + 9, leader_epoch, MAGIC, crc32c.crc32c(after_crc))
    return head + after_crc


def merge(batches: list[Batch]) -> bytes:
    """One batch holding every record of `batches` (mergeable ones, in offset order)."""
    recs: list[Record] = []
    for b in batches:
        if not b.mergeable:
            raise BatchError(f"batch at {b.base_offset} is compressed, transactional or a control batch")
        recs.extend(records(b))
    return encode_batch(recs, batches[0].leader_epoch)
