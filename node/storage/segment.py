"""The on-disk format of write-ahead-log segments, and the scanner recovery uses.

A segment file is named by the index of its first record (`0000000000000001.seg`) and holds:

    segment header   magic "FLOTWAL\\0" | version u16 | flags u16 | generation u64 |
                     first index u64 | cluster-id length u16 | cluster id (UTF-8) |
                     CRC32 of everything before it (u32)
    record*          payload length u32 | CRC32 of payload u32 | payload

(all integers little-endian). A payload is a msgpack array, whose length is the record's
version:

    version 2   [index, term, kind, data, ts_ms]   (ts_ms: the leader's stamp, see Entry)
    version 1   [index, term, kind, data]          (the first release; read with ts_ms 0)

Segment header version 2 (what this build creates) holds version 2 records only. A version 1
segment, written by the first release, holds version 1 records, and version 2 ones after them
when it was still the newest segment when the member was upgraded; so a first-release data dir
is used as it is, and a first-release build refuses the segments this one creates by their
header version (rather than by a record it cannot decode). The cluster id in every segment means
a volume mounted into the wrong cluster is refused instead of merged; the generation is
explained in logstart.py.

A record's checksum covers only its payload; a damaged length is still caught, because it
makes the checksum read the wrong bytes (or run off the end). A zero length is invalid, so a
zero-filled tail (what some file systems leave after a crash) never reads as records.
"""

from __future__ import annotations

import re
import struct
import zlib
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import msgpack
from flotilla.node.consensus.types import Entry, EntryKind

from .errors import CorruptDataError

MAGIC = b"FLOTWAL\x00"
VERSION = 2
SUFFIX = ".seg"
RECORD_V1 = 1  # [index, term, kind, data]
RECORD_V2 = 2  # [index, term, kind, data, ts_ms]
# The record versions each segment header version may hold (see the module docstring).
RECORD_VERSIONS = {1: frozenset({RECORD_V1, RECORD_V2}), 2: frozenset({RECORD_V2})}

_FIXED = struct.Struct("<8sHHQQH")
_CRC = struct.Struct("<I")
RECORD_HEADER = struct.Struct("<II")
# The first byte of every record payload: a msgpack fixarray of 4 (version 1) or 5 (version 2).
_MARKERS = {RECORD_V1: 0x94, RECORD_V2: 0x95}
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
    version: int = VERSION

    @property
    def record_versions(self) -> frozenset[int]:
        return RECORD_VERSIONS[self.version]


def encode_header(cluster_id: str, generation: int, first_index: int,
                  version: int = VERSION) -> bytes:
    """A segment header (`version` other than the current one only to write test fixtures)."""
    cid = cluster_id.encode()
    head = _FIXED.pack(MAGIC, version, 0, generation, first_index, len(cid)) + cid
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
    if version not in RECORD_VERSIONS:
        raise CorruptDataError(
            path,
            8,
            f"segment format version {version} is not supported (this build reads versions "
            f"{', '.join(map(str, sorted(RECORD_VERSIONS)))})",
            advice="run the Flotilla version that wrote this data dir, or restore from peers",
        )
    try:
        cluster_id = raw[_FIXED.size : end].decode()
    except UnicodeDecodeError as exc:
        raise CorruptDataError(path, _FIXED.size, "cluster id is not UTF-8") from exc
    return SegmentHeader(generation, first_index, cluster_id, end + _CRC.size, version)


def _fields(entry: Entry, version: int) -> list:
    fields = [entry.index, entry.term, int(entry.kind), entry.data]
    if version == RECORD_V2:
        fields.append(entry.ts_ms)
    return fields


def encode_record(entry: Entry, version: int = RECORD_V2) -> bytes:
    """One record (`version` 1 only to write test fixtures: it drops `ts_ms`)."""
    payload = msgpack.packb(_fields(entry, version))
    return RECORD_HEADER.pack(len(payload), zlib.crc32(payload)) + payload


def record_encoder(version: int = RECORD_V2) -> Callable[[Entry], bytes]:
    """A fast encoder for the append path (reuses one msgpack Packer)."""
    pack = msgpack.Packer().pack
    pack_header = RECORD_HEADER.pack
    crc32 = zlib.crc32
    if version != RECORD_V2:
        def encode_old(entry: Entry) -> bytes:
            payload = pack(_fields(entry, version))
            return pack_header(len(payload), crc32(payload)) + payload

        return encode_old

    def encode(entry: Entry) -> bytes:
        payload = pack([entry.index, entry.term, int(entry.kind), entry.data, entry.ts_ms])
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


def scan_records(buf: bytes, start: int, first_index: int, keep_after: int,
                 versions: frozenset[int] = RECORD_VERSIONS[VERSION], *,
                 gaps: bool = False) -> ScanResult:
    """Read records from `buf[start:]`, which must begin with index `first_index` and hold
    records of the given `versions` only. With `gaps` (a compacted archive segment), indexes
    need only increase, from `first_index` on.

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
    v1 = RECORD_V1 in versions
    v2 = RECORD_V2 in versions
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
            record = unpackb(payload)
            fields = len(record)
            if fields == 5 and v2:
                index, term, kind, data, ts = record
            elif fields == 4 and v1:
                index, term, kind, data = record
                ts = 0
            else:
                raise ValueError(f"{fields} fields is not a record version this segment holds")
            if not (isinstance(term, int) and isinstance(kind, int) and isinstance(data, bytes)
                    and isinstance(ts, int)):
                raise TypeError("wrong field types")
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            result.error = f"record has a valid checksum but is not a log entry ({exc})"
            break
        if index != expected:
            if not gaps or not isinstance(index, int) or index < expected:
                result.error = (f"record holds index {index} where index {expected} "
                                f"{'or above ' if gaps else ''}was expected")
                break
            expected = index
        offsets.append(pos)
        if index > keep_after:
            kept.append(Entry(index, term, kinds.get(kind, kind), data, ts))
        expected += 1
        pos = body + length
        result.end = pos
    return result


def valid_record_after(buf: bytes, offset: int, expected_index: int,
                       versions: frozenset[int] = RECORD_VERSIONS[VERSION]) -> int | None:
    """The offset of an intact record after `offset` that could follow in this log, or None.

    Used to tell a torn tail (nothing valid follows the damage at `offset`, where index
    `expected_index` should have been) from damage in the middle of the newest segment
    (intact records follow it). A candidate must have a valid checksum, decode as an entry,
    and hold an index that fits in the bytes between: so entry data that happens to contain
    a record-shaped byte string is not mistaken for the log going on. Every payload starts with
    the msgpack byte of its version, which narrows the search to a few candidates per record.
    """
    unpack_header = RECORD_HEADER.unpack_from
    size = len(buf)
    for marker in _positions(buf, offset + 1 + RECORD_HEADER.size,
                             [bytes([_MARKERS[v]]) for v in sorted(versions)]):
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
    return None


def _positions(buf: bytes, start: int, needles: list[bytes]) -> Iterator[int]:
    """Every offset at or after `start` where one of the one-byte `needles` occurs, in order."""
    found = {needle: buf.find(needle, start) for needle in needles}
    while True:
        live = [at for at in found.values() if at != -1]
        if not live:
            return
        at = min(live)
        yield at
        for needle, position in found.items():
            if position == at:
                found[needle] = buf.find(needle, at + 1)
