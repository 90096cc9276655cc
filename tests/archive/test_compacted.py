"""Compacted segments (segments.py version 3) and what a manifest does with them: they keep
some entries of their range with gaps, carry their delete markers' horizons, are never replayed
by a restore, and survive the retention floor that drops the raw segments they replaced."""

from __future__ import annotations

import json

import pytest
from flotilla.node.archive import ArchiveCorrupt, Manifest, SegmentRecord, SnapshotRecord
from flotilla.node.archive.layout import (
    compacted_key,
    parse_compacted_key,
    segment_key,
    snapshot_key,
)
from flotilla.node.archive.segments import (
    COMPACTED,
    decode_segment,
    encode_compacted,
    encode_segment,
    read_segment_header,
)
from flotilla.node.consensus.types import Entry, EntryKind
from hypothesis import given
from hypothesis import strategies as st


def entry(index: int) -> Entry:
    return Entry(index, 2, EntryKind.NORMAL, f"cmd{index}".encode(), 1_700_000_000_000 + index)


@given(st.sets(st.integers(1, 500), max_size=40), st.data())
def test_kept_entries_round_trip_with_gaps_and_horizons(indexes, data):
    kept = [entry(i) for i in sorted(indexes)]
    markers = data.draw(st.sets(st.sampled_from(sorted(indexes)))) if indexes else set()
    horizons = {i: 5_000 + i for i in markers}
    encoded = encode_compacted("c1", 1, 500, kept, horizons)
    header = read_segment_header(encoded)
    assert (header.version, header.first, header.last, header.compacted) == (COMPACTED, 1, 500,
                                                                             True)
    assert dict(header.horizons) == horizons
    assert decode_segment(encoded, cluster_id="c1") == kept


def test_a_compacted_segment_may_keep_nothing():
    encoded = encode_compacted("c1", 10, 20, [], {})
    assert decode_segment(encoded) == []


@pytest.mark.parametrize("bad", [
    lambda: encode_compacted("c1", 1, 5, [entry(6)], {}),
    lambda: encode_compacted("c1", 1, 9, [entry(4), entry(4)], {}),
    lambda: encode_compacted("c1", 1, 9, [entry(5), entry(4)], {}),
    lambda: encode_compacted("c1", 1, 9, [entry(4)], {5: 1}),
    lambda: encode_compacted("c1", 5, 4, [], {}),
])
def test_what_cannot_be_a_compacted_segment_is_refused(bad):
    with pytest.raises(ValueError):
        bad()


def test_damage_and_out_of_order_records_are_caught():
    good = encode_compacted("c1", 1, 50, [entry(3), entry(9), entry(40)], {9: 1})
    size = read_segment_header(good).size
    for position in (10, size - 2, size + 9, len(good) - 1):
        damaged = bytearray(good)
        damaged[position] ^= 0x40
        with pytest.raises(ArchiveCorrupt):
            decode_segment(bytes(damaged), name="x")
    # A record beyond the header's range, spliced in from a wider segment.
    wider = encode_compacted("c1", 1, 60, [entry(3), entry(9), entry(55)], {})
    spliced = good[:size] + wider[read_segment_header(wider).size:]
    with pytest.raises(ArchiveCorrupt, match="beyond its range"):
        decode_segment(spliced, name="x")
    # Going backwards is damage, not a gap.
    records = good[size:]
    first_len = 8 + int.from_bytes(records[:4], "little")
    swapped = good[:size] + records[first_len:] + records[:first_len]
    with pytest.raises(ArchiveCorrupt, match="or above"):
        decode_segment(swapped, name="x")


def test_a_raw_segment_with_a_gap_is_still_damage():
    raw = encode_segment("c1", [entry(1), entry(2)])
    size = read_segment_header(raw).size
    other = encode_segment("c1", [entry(5)])
    spliced = raw[:size] + other[read_segment_header(other).size:] + raw[size:]
    with pytest.raises(ArchiveCorrupt):
        decode_segment(spliced, name="x")


def test_compacted_keys_name_their_pass():
    key = compacted_key(1, 900, 900)
    assert parse_compacted_key(key) == (1, 900, 900)
    assert parse_compacted_key(segment_key(1, 900)) is None


def snap(index: int) -> SnapshotRecord:
    return SnapshotRecord(index, 1, snapshot_key(index, 1), 100, "a" * 64, 1000 + index)


def raw(first: int, last: int) -> SegmentRecord:
    return SegmentRecord(first, last, segment_key(first, last), 10, "b" * 64)


def packed(first: int, last: int, through: int, kept: int = 3) -> SegmentRecord:
    return SegmentRecord(first, last, compacted_key(first, last, through), 7, "c" * 64,
                         compacted=True, entries=kept)


def compacted_manifest(**overrides) -> Manifest:
    fields = dict(snapshots=[snap(100), snap(250)],
                  segments=[packed(1, 60, 100), packed(61, 100, 100), raw(101, 200),
                            raw(201, 300)],
                  retention_floor=100, cleaned_through=100, log_start=0)
    fields.update(overrides)
    return Manifest.create("c1", 7, "2026-11-26T00:00:00Z", **fields)


def test_restores_never_plan_through_compacted_segments():
    m = compacted_manifest()
    assert m.restorable_ranges() == [(100, 300)]
    assert m.last_archived_index == 300
    assert m.chain(100, 250) == (raw(101, 200), raw(201, 300))
    assert m.chain(0, 50) is None
    assert m.reach(0) == 0


def test_the_floor_keeps_compacted_segments_and_the_log_start_snapshot():
    m = compacted_manifest(snapshots=[snap(40), snap(100)], retention_floor=100, log_start=40)
    assert [s.index for s in m.snapshots] == [40, 100]
    assert [s.key for s in m.compacted_segments] == [packed(1, 60, 100).key,
                                                      packed(61, 100, 100).key]
    # Without compaction the same floor drops the old snapshot, as before.
    plain = Manifest.create("c1", 1, "t", [snap(40), snap(100)], [raw(101, 200)], 100)
    assert [s.index for s in plain.snapshots] == [100]


def test_a_compacted_manifest_round_trips_as_version_2_and_older_ones_stay_version_1():
    m = compacted_manifest()
    document = json.loads(m.to_json())
    assert document["version"] == 2
    assert (document["cleaned_through"], document["log_start"]) == (100, 0)
    assert document["segments"][0]["compacted"] is True
    assert Manifest.from_json(m.to_json()) == m
    plain = Manifest.create("c1", 1, "t", [snap(100)], [raw(101, 200)])
    assert json.loads(plain.to_json())["version"] == 1
    assert "cleaned_through" not in json.loads(plain.to_json())


def test_merging_keeps_what_compaction_recorded():
    m = compacted_manifest()
    merged = m.merged(seq=8, created="t", segments=[raw(301, 400)])
    assert (merged.cleaned_through, merged.log_start, merged.retention_floor) == (100, 0, 100)
    assert merged.compacted_segments == m.compacted_segments
    assert merged.last_archived_index == 400


def test_a_compacted_flag_that_is_not_a_boolean_is_corrupt():
    document = json.loads(compacted_manifest().to_json())
    document["segments"][0]["compacted"] = "yes"
    with pytest.raises(ArchiveCorrupt):
        Manifest.from_json(json.dumps(document).encode(), name="m.json")
