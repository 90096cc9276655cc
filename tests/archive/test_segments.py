"""The archived segment format (node/archive/segments.py): it round-trips committed entries,
times included, reads the first release's segments (version 1, no times), and refuses every
damaged, truncated, extended or foreign object."""

from __future__ import annotations

import struct
import zlib

import pytest
from flotilla.node.archive import (
    ArchiveCorrupt,
    decode_segment,
    encode_segment,
    read_segment_header,
)
from flotilla.node.consensus.types import Entry, EntryKind
from flotilla.node.storage.segment import RECORD_V1, RECORD_V2, encode_record
from hypothesis import given
from hypothesis import strategies as st


def entries(first: int, last: int, term: int = 3, *, timed: bool = True) -> list[Entry]:
    return [
        Entry(i, term, EntryKind.NOOP if i % 5 == 0 else EntryKind.NORMAL, f"v{i}".encode() * 3,
              1_800_000_000_000 + 7 * i if timed else 0)
        for i in range(first, last + 1)
    ]


@given(
    first=st.integers(1, 2**40),
    datas=st.lists(st.binary(max_size=64), min_size=1, max_size=20),
    term=st.integers(0, 2**63),
    kind=st.sampled_from(list(EntryKind)),
    ts=st.integers(0, 2**63),
)
def test_entries_round_trip(first, datas, term, kind, ts):
    original = [Entry(first + n, term, kind, data, ts + n) for n, data in enumerate(datas)]
    encoded = encode_segment("c1", original)
    assert decode_segment(encoded, cluster_id="c1") == original
    header = read_segment_header(encoded)
    assert (header.first, header.last, header.cluster_id) == (first, first + len(datas) - 1, "c1")
    assert header.version == 2


def test_a_first_release_segment_reads_back_with_time_zero():
    encoded = encode_segment("c1", entries(4, 9), version=1)
    assert read_segment_header(encoded).version == 1
    assert decode_segment(encoded, cluster_id="c1") == entries(4, 9, timed=False)


@pytest.mark.parametrize("version", [1, 2])
def test_a_record_of_the_other_version_inside_a_segment_is_refused(version):
    """A segment holds records of its own version only: anything else is damage."""
    good = encode_segment("c1", entries(4, 5), version=version)
    other = RECORD_V1 if version == 2 else RECORD_V2
    header = good[: read_segment_header(good).size]
    mixed = header + b"".join(encode_record(e, other) for e in entries(4, 5))
    with pytest.raises(ArchiveCorrupt, match="not a log entry"):
        decode_segment(mixed, name="seg")


def test_a_segment_of_an_unknown_version_is_refused_naming_the_versions_read():
    encoded = bytearray(encode_segment("c1", entries(1, 2)))
    encoded[8] = 4  # the version; the header checksum is recomputed below
    end = read_segment_header(bytes(encoded[:8]) + b"\x02" + bytes(encoded[9:])).size - 4
    encoded[end:end + 4] = struct.pack("<I", zlib.crc32(bytes(encoded[:end])))
    with pytest.raises(ArchiveCorrupt, match="version 4, but this build reads versions 1, 2, 3"):
        decode_segment(bytes(encoded), name="seg")


def test_the_encoding_is_deterministic_so_re_uploads_are_recognised():
    assert encode_segment("c1", entries(10, 20)) == encode_segment("c1", entries(10, 20))


@pytest.mark.parametrize(
    "bad",
    [[], [Entry(2, 1), Entry(4, 1)], [Entry(3, 1), Entry(2, 1)], [Entry(0, 1)]],
    ids=["empty", "gap", "backwards", "index-zero"],
)
def test_only_consecutive_entries_make_a_segment(bad):
    with pytest.raises(ValueError):
        encode_segment("c1", bad)


def test_every_flipped_byte_is_detected():
    encoded = encode_segment("c1", entries(7, 12))
    for offset in range(len(encoded)):
        damaged = bytearray(encoded)
        damaged[offset] ^= 0x40
        with pytest.raises(ArchiveCorrupt):
            decode_segment(bytes(damaged), name="seg", cluster_id="c1")


def test_every_truncation_and_any_extension_is_detected():
    encoded = encode_segment("c1", entries(7, 12))
    for length in range(len(encoded)):
        with pytest.raises(ArchiveCorrupt):
            decode_segment(encoded[:length], name="seg")
    with pytest.raises(ArchiveCorrupt, match="holds 7 entries"):
        # a whole extra record, valid on its own, is still not what the header promised
        decode_segment(encoded + encode_record(entries(13, 13)[0]))
    with pytest.raises(ArchiveCorrupt):
        decode_segment(encoded + b"\x00")


def test_a_segment_of_another_cluster_is_refused():
    with pytest.raises(ArchiveCorrupt, match="belongs to cluster 'other'"):
        decode_segment(encode_segment("other", entries(1, 3)), name="seg", cluster_id="c1")


def test_errors_name_the_object():
    with pytest.raises(ArchiveCorrupt, match=r"s3://b/p/c1/segments/x\.seg") as caught:
        decode_segment(b"garbage", name="s3://b/p/c1/segments/x.seg")
    assert caught.value.key == "s3://b/p/c1/segments/x.seg"
