"""The archived log segment: committed entries first..last as one self-describing object.

Layout (integers little-endian):

    header   magic "FLOTASEG" | version u16 | flags u16 (0) | first index u64 | last index u64 |
             cluster-id length u16 | cluster id (UTF-8) | CRC32 of everything before it u32
    record*  exactly last - first + 1 records, in index order, in the write-ahead log's record
             format (node/storage/segment.py): payload length u32 | CRC32 of payload u32 |
             payload = msgpack [index, term, kind, data, ts_ms]

Nothing follows the last record. The header names the range, so a truncated or padded object is
caught even before its SHA-256 is checked, and the cluster id means segments of another
cluster are never replayed by mistake. The encoding is deterministic (the only time in it is
each entry's `ts_ms`, which is part of the log), so the same committed entries always encode to
the same bytes: a re-upload after a crash, or by the next leader, is recognised as identical.

Version 1 segments, written by the first release, hold version 1 records (`[index, term, kind,
data]`, read with `ts_ms` 0); this build writes version 2 segments of version 2 records.

Version 3 is a *compacted* segment (written by `flotilla pipeline compact`): the header's range
first..last still names every index the segment stands for, but only some of those entries are
kept (the last effective change of each key), so the records' indexes increase with gaps, and
there may be none. Between the cluster id and the header's CRC it holds a metadata block
(length u32 | msgpack map): `horizons`, the `[index, delete horizon in log-time ms]` of each
delete marker it keeps. Compacted segments rebuild no state on their own; the manifest marks
them and restores never replay them (see manifest.py).
"""

from __future__ import annotations

import itertools
import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import msgpack
from flotilla.node.consensus.types import Entry
from flotilla.node.storage.segment import RECORD_V1, RECORD_V2, encode_record, scan_records

from .errors import ArchiveCorrupt

MAGIC = b"FLOTASEG"
VERSION = 2
COMPACTED = 3  # the version of a compacted segment
RECORD_VERSIONS = {1: frozenset({RECORD_V1}), 2: frozenset({RECORD_V2}),
                   COMPACTED: frozenset({RECORD_V2})}  # by segment version

_FIXED = struct.Struct("<8sHHQQH")
_CRC = struct.Struct("<I")
_META = struct.Struct("<I")
MAX_META = 64 << 20  # a metadata block larger than this is damage, not a segment


@dataclass(frozen=True, slots=True)
class SegmentHeader:
    version: int
    first: int
    last: int
    cluster_id: str
    size: int  # bytes; the first record starts here
    horizons: Mapping[int, int] = field(default_factory=dict)  # compacted: marker -> horizon

    @property
    def compacted(self) -> bool:
        return self.version == COMPACTED


def encode_segment(cluster_id: str, entries: Sequence[Entry], *, version: int = VERSION
                   ) -> bytes:
    """Encode committed `entries` (non-empty, consecutive indexes) for the archive (`version`
    other than the current one only to write test fixtures)."""
    if not entries:
        raise ValueError("a segment holds at least one entry")
    first, last = entries[0].index, entries[-1].index
    if first < 1 or last - first + 1 != len(entries) or any(
        entry.index != first + offset for offset, entry in enumerate(entries)
    ):
        raise ValueError(f"segment entries must be consecutive indexes from {first}")
    cid = cluster_id.encode()
    record_version = min(RECORD_VERSIONS[version])
    head = _FIXED.pack(MAGIC, version, 0, first, last, len(cid)) + cid
    parts = [head, _CRC.pack(zlib.crc32(head))]
    parts.extend(encode_record(entry, record_version) for entry in entries)
    return b"".join(parts)


def encode_compacted(cluster_id: str, first: int, last: int, entries: Sequence[Entry],
                     horizons: Mapping[int, int]) -> bytes:
    """Encode a compacted segment standing for indexes first..last that keeps `entries`
    (indexes increasing within the range; possibly none) and the delete horizons of the
    markers among them."""
    if not 1 <= first <= last:
        raise ValueError(f"a compacted segment's range {first}..{last} is empty")
    indexes = [entry.index for entry in entries]
    if any(not first <= i <= last for i in indexes) or any(
            a >= b for a, b in itertools.pairwise(indexes)):
        raise ValueError(f"compacted entries must have increasing indexes in {first}..{last}")
    if not set(horizons) <= set(indexes):
        raise ValueError("a delete horizon names an entry the segment does not keep")
    cid = cluster_id.encode()
    meta = msgpack.packb({"horizons": sorted(horizons.items())})
    head = (_FIXED.pack(MAGIC, COMPACTED, 0, first, last, len(cid)) + cid
            + _META.pack(len(meta)) + meta)
    parts = [head, _CRC.pack(zlib.crc32(head))]
    parts.extend(encode_record(entry, RECORD_V2) for entry in entries)
    return b"".join(parts)


def read_segment_header(data: bytes, *, name: str = "segment") -> SegmentHeader:
    """Parse and check the header of an encoded segment (`name` is used in errors)."""

    def corrupt(reason: str) -> ArchiveCorrupt:
        return ArchiveCorrupt(f"{name} is not a valid archived segment: {reason}", key=name)

    if len(data) < _FIXED.size:
        raise corrupt(f"only {len(data)} bytes, shorter than a header")
    magic, version, _flags, first, last, cid_length = _FIXED.unpack_from(data)
    if magic != MAGIC:
        raise corrupt(f"bad magic {magic!r}")
    end = _FIXED.size + cid_length
    meta_at = end
    if version == COMPACTED:
        if len(data) < end + _META.size:
            raise corrupt("header is cut short")
        (meta_length,) = _META.unpack_from(data, end)
        if meta_length > MAX_META:
            raise corrupt(f"metadata block of {meta_length} bytes")
        end += _META.size + meta_length
    if len(data) < end + _CRC.size:
        raise corrupt("header is cut short")
    (crc,) = _CRC.unpack_from(data, end)
    if zlib.crc32(data[:end]) != crc:
        raise corrupt("header checksum mismatch")
    if version not in RECORD_VERSIONS:
        raise ArchiveCorrupt(
            f"{name} is archived segment format version {version}, but this build reads "
            f"versions {', '.join(map(str, sorted(RECORD_VERSIONS)))}: restore with the "
            "Flotilla version that wrote it",
            key=name,
        )
    if not 1 <= first <= last:
        raise corrupt(f"header range {first}..{last} is empty or starts below 1")
    try:
        cluster_id = data[_FIXED.size : _FIXED.size + cid_length].decode()
    except UnicodeDecodeError:
        raise corrupt("cluster id is not UTF-8") from None
    horizons: dict[int, int] = {}
    if version == COMPACTED:
        try:
            meta = msgpack.unpackb(data[meta_at + _META.size : end])
            horizons = {int(i): int(h) for i, h in meta["horizons"]}
        except (ValueError, TypeError, KeyError, msgpack.UnpackException):
            raise corrupt("metadata block does not decode") from None
    return SegmentHeader(version, first, last, cluster_id, end + _CRC.size, horizons)


def decode_segment(
    data: bytes, *, name: str = "segment", cluster_id: str | None = None
) -> list[Entry]:
    """The entries of an encoded segment, checked whole: header, every record's CRC, index
    contiguity from the header's first to its last, and no bytes beyond. Raises ArchiveCorrupt
    naming `name` on any damage, or if `cluster_id` is given and the segment is another's."""
    header = read_segment_header(data, name=name)
    if cluster_id is not None and header.cluster_id != cluster_id:
        raise ArchiveCorrupt(
            f"{name} belongs to cluster {header.cluster_id!r}, not {cluster_id!r}: it was "
            "copied into the wrong place in the archive",
            key=name,
        )
    return decode_with_header(data, header, name=name)


def decode_with_header(data: bytes, header: SegmentHeader, *, name: str = "segment"
                       ) -> list[Entry]:
    """`decode_segment`'s checks after its header is read and its cluster id checked."""
    scan = scan_records(data, header.size, header.first, 0, RECORD_VERSIONS[header.version],
                        gaps=header.compacted)
    if scan.error is not None:
        raise ArchiveCorrupt(
            f"{name} is damaged at byte offset {scan.end} (after {len(scan.entries)} good "
            f"records): {scan.error}",
            key=name,
        )
    if header.compacted:
        if scan.entries and scan.entries[-1].index > header.last:
            raise ArchiveCorrupt(
                f"{name} keeps entry {scan.entries[-1].index}, beyond its range "
                f"{header.first}..{header.last}", key=name)
        return scan.entries
    expected = header.last - header.first + 1
    if len(scan.entries) != expected:
        raise ArchiveCorrupt(
            f"{name} holds {len(scan.entries)} entries, but its header says "
            f"{header.first}..{header.last} ({expected}): it was cut short or extended",
            key=name,
        )
    return scan.entries
