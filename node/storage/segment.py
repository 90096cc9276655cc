"""The on-disk format of write-ahead-log segments, and the scanner recovery uses.

A segment file is named by the index of its first record (`0000000000000001.seg`) and holds:

    segment header   magic "FLOTWAL\\0" | version u16 | flags u16 | generation u64 |
                     first index u64 | cluster-id length u16 | cluster id (UTF-8) |
                     CRC32 of everything before it (u32)
    record*          payload length u32 | CRC32 of payload u32 | payload

(all integers little-endian). A payload is the msgpack array [index, term, kind, data]. The
cluster id in every segment means a volume mounted into the wrong cluster is refused instead of
merged; the generation is explained in logstart.py.

A record's checksum covers only its payload; a damaged length is still caught, because it
makes the checksum read the wrong bytes (or run off the end). A zero length is invalid, so a
zero-filled tail (what some file systems leave after a crash) never reads as records.
"""

from __future__ import annotations

import re
import struct
import zlib
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgpack
from flotilla.node.consensus.types import Entry, EntryKind

from .errors import CorruptDataError

MAGIC = b"FLOTWAL\x00"
VERSION = 1
SUFFIX = ".seg"

_FIXED = struct.Struct("<8sHHQQH")
_CRC = struct.Struct("<I")
RECORD_HEADER = struct.Struct("<II")
_ARRAY4 = 0x94  # msgpack fixarray of 4: the first byte of every record payload
_NAME = re.compile(r"^(\d{16})\.seg$")
_KINDS = {int(kind): kind for kind in EntryKind}


def segment_name(first_index: int) -> str:
    return f"{first_index:016d}{SUFFIX}"


def parse_segment_name(name: str) -> int | None:
    """The first index a segment file name claims, or None if it is not a segment name."""
    match = _NAME.match(name)
    return int(match.group(1)) if match else None


@dataclass(frozen=True, slots=True)
class SegmentHeader:
    generation: int
    first_index: int
    cluster_id: str
    size: int  # bytes; records start here


def encode_header(cluster_id: str, generation: int, first_index: int) -> bytes:
    cid = cluster_id.encode()
    head = _FIXED.pack(MAGIC, VERSION, 0, generation, first_index, len(cid)) + cid
    return head + _CRC.pack(zlib.crc32(head))


def decode_header(raw: bytes, path: Path) -> SegmentHeader:
    """Parse and check a segment header (`raw` is the start of the file)."""
    if len(raw) < _FIXED.size:
        raise CorruptDataError(path, 0, f"segment header is cut short ({len(raw)} bytes)")
    magic, version, _flags, generation, first_index, cid_len = _FIXED.unpack_from(raw)
    if magic != MAGIC:
        raise CorruptDataError(path, 0, f"not a Flotilla log segment (magic {magic!r})")
    end = _FIXED.size + cid_len
    if len(raw) < end + _CRC.size:
        raise CorruptDataError(path, 0, "segment header is cut short")
    (crc,) = _CRC.unpack_from(raw, end)
    if zlib.crc32(raw[:end]) != crc:
        raise CorruptDataError(path, 0, "segment header checksum mismatch")
    if version != VERSION:
        raise CorruptDataError(
            path,
            8,
            f"segment format version {version} is not supported (this build reads {VERSION})",
            advice="run the Flotilla version that wrote this data dir, or restore from peers",
        )
    try:
        cluster_id = raw[_FIXED.size : end].decode()
    except UnicodeDecodeError as exc:
        raise CorruptDataError(path, _FIXED.size, "cluster id is not UTF-8") from exc
    return SegmentHeader(generation, first_index, cluster_id, end + _CRC.size)


def encode_record(entry: Entry) -> bytes:
    payload = msgpack.packb([entry.index, entry.term, int(entry.kind), entry.data])
    return RECORD_HEADER.pack(len(payload), zlib.crc32(payload)) + payload


def record_encoder() -> Callable[[Entry], bytes]:
    """A fast encoder for the append path (reuses one msgpack Packer)."""
    pack = msgpack.Packer().pack
    pack_header = RECORD_HEADER.pack
    crc32 = zlib.crc32

    def encode(entry: Entry) -> bytes:
        payload = pack([entry.index, entry.term, int(entry.kind), entry.data])
        return pack_header(len(payload), crc32(payload)) + payload

    return encode


@dataclass(slots=True)
class ScanResult:
    """What `scan_records` found: records are whole and in index order up to `end`."""

    offsets: array = field(default_factory=lambda: array("Q"))  # start of each whole record
    entries: list[Entry] = field(default_factory=list)  # those with index > keep_after
    end: int = 0  # byte offset just after the last whole record
    error: str | None = None  # why the bytes at `end` are not a whole record, if any
    torn: bool = False  # the error is of a kind a torn write can produce


def scan_records(buf: bytes, start: int, first_index: int, keep_after: int) -> ScanResult:
    """Read records from `buf[start:]`, which must begin with index `first_index`.

    Stops at the first byte range that is not a whole, valid record and says why. A short
    header, a length running past the end, a zero length or a checksum mismatch are what a torn
    write leaves (`torn=True`); a record with a good checksum that does not decode, or whose
    index is out of sequence, is never a torn write.
    """
    result = ScanResult(end=start)
    offsets = result.offsets
    kept = result.entries
    unpack_header = RECORD_HEADER.unpack_from
    crc32 = zlib.crc32
    unpackb = msgpack.unpackb
    kinds = _KINDS
    view = memoryview(buf)
    size = len(buf)
    pos = start
    expected = first_index
    while pos < size:
        if size - pos < RECORD_HEADER.size:
            result.error, result.torn = "record header is cut short", True
            break
        length, crc = unpack_header(buf, pos)
        body = pos + RECORD_HEADER.size
        if length == 0:
            result.error, result.torn = "record length is zero", True
            break
        if body + length > size:
            result.error = f"record of {length} bytes runs past the end of the file"
            result.torn = True
            break
        payload = view[body : body + length]
        if crc32(payload) != crc:
            result.error, result.torn = "record checksum mismatch", True
            break
        try:
            index, term, kind, data = unpackb(payload)
            if not (isinstance(term, int) and isinstance(kind, int) and isinstance(data, bytes)):
                raise TypeError("wrong field types")
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            result.error = f"record has a valid checksum but is not a log entry ({exc})"
            break
        if index != expected:
            result.error = f"record holds index {index} where index {expected} was expected"
            break
        offsets.append(pos)
        if index > keep_after:
            kept.append(Entry(index, term, kinds.get(kind, kind), data))
        expected += 1
        pos = body + length
        result.end = pos
    return result


def valid_record_after(buf: bytes, offset: int, expected_index: int) -> int | None:
    """The offset of an intact record after `offset` that could follow in this log, or None.

    Used to tell a torn tail (nothing valid follows the damage at `offset`, where index
    `expected_index` should have been) from damage in the middle of the newest segment
    (intact records follow it). A candidate must have a valid checksum, decode as an entry,
    and hold an index that fits in the bytes between: so entry data that happens to contain
    a record-shaped byte string is not mistaken for the log going on. Every payload starts with
    the same msgpack byte, which narrows the search to a few candidates per record.
    """
    unpack_header = RECORD_HEADER.unpack_from
    marker_byte = bytes([_ARRAY4])
    size = len(buf)
    marker = buf.find(marker_byte, offset + 1 + RECORD_HEADER.size)
    while marker != -1:
        pos = marker - RECORD_HEADER.size
        length, crc = unpack_header(buf, pos)
        if 0 < length <= size - marker and zlib.crc32(buf[marker : marker + length]) == crc:
            try:
                index = msgpack.unpackb(buf[marker : marker + length])[0]
            except (ValueError, TypeError, IndexError, KeyError, msgpack.UnpackException):
                index = None
            smallest_record = RECORD_HEADER.size + 5  # header + [i, t, k, b""] at the least
            if isinstance(index, int) and (
                expected_index <= index <= expected_index + (pos - offset) // smallest_record
            ):
                return pos
        marker = buf.find(marker_byte, marker + 1)
    return None
