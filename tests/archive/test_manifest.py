"""The manifest (node/archive/manifest.py): which indexes its records can rebuild, and its JSON.

The chain search is checked against a dumb breadth-first version on random archives."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from flotilla.node.archive import ArchiveCorrupt, Manifest, SegmentRecord, SnapshotRecord
from flotilla.node.archive.layout import segment_key, snapshot_key
from hypothesis import given
from hypothesis import strategies as st


def snap(index: int, term: int = 1) -> SnapshotRecord:
    return SnapshotRecord(index, term, snapshot_key(index, term), 100, "a" * 64)


def seg(first: int, last: int) -> SegmentRecord:
    return SegmentRecord(first, last, segment_key(first, last), 10, "b" * 64)


def manifest(snapshots=(), segments=(), floor=0) -> Manifest:
    return Manifest.create("c1", 1, "2024-01-01T00:00:00Z", snapshots, segments, floor)


def test_without_gaps_the_archive_reaches_the_last_segment():
    m = manifest([snap(10)], [seg(11, 20), seg(21, 30)])
    assert m.last_archived_index == 30
    assert m.restorable_ranges() == [(10, 30)]
    assert m.chain(10, 25) == (seg(11, 20), seg(21, 30))


def test_segments_from_index_one_make_the_empty_state_a_base():
    m = manifest([], [seg(1, 5), seg(6, 9)])
    assert m.last_archived_index == 9
    assert m.restorable_ranges() == [(0, 9)]
    assert m.chain(0, 7) == (seg(1, 5), seg(6, 9))


def test_after_a_gap_progress_continues_from_the_next_snapshot():
    # entries 31..49 never reached the archive; the snapshot at 50 bridges the gap
    m = manifest([snap(10), snap(50)], [seg(11, 30), seg(51, 60)])
    assert m.last_archived_index == 60
    assert m.restorable_ranges() == [(10, 30), (50, 60)]
    assert m.chain(10, 40) is None
    assert m.chain(50, 55) == (seg(51, 60),)


def test_overlapping_segments_from_two_leaders_still_chain():
    m = manifest([snap(5)], [seg(6, 20), seg(6, 12), seg(13, 30), seg(21, 25)])
    assert m.reach(5) == 30
    assert m.chain(5, 30) == (seg(6, 20), seg(13, 30))


def test_create_sorts_deduplicates_and_drops_what_retention_removed():
    m = manifest([snap(30), snap(10), snap(30)], [seg(21, 30), seg(5, 10), seg(11, 20)], floor=20)
    assert m.snapshots == (snap(30),)
    assert m.segments == (seg(21, 30),)  # 11..20 ends at the floor: the snapshot covers it


def test_json_round_trips_and_is_readable():
    m = manifest([snap(10)], [seg(11, 20)])
    document = json.loads(m.to_json())
    assert document["last_archived_index"] == 20
    assert document["snapshots"][0] == {
        "index": 10, "term": 1, "key": snapshot_key(10, 1), "bytes": 100, "sha256": "a" * 64,
    }
    assert document["segments"][0]["first"] == 11
    assert Manifest.from_json(m.to_json()) == m


def test_times_round_trip_and_are_left_out_where_unknown():
    timed = [replace(snap(10), ts_ms=1_800_000_000_100),
             replace(seg(11, 20), first_ts_ms=1_800_000_000_110, last_ts_ms=1_800_000_000_200),
             replace(seg(21, 30), last_ts_ms=1_800_000_000_300)]  # first entry's time unknown
    m = manifest(timed[:1], timed[1:])
    document = json.loads(m.to_json())
    assert document["snapshots"][0]["ts_ms"] == 1_800_000_000_100
    assert (document["segments"][0]["first_ts_ms"], document["segments"][0]["last_ts_ms"]) == (
        1_800_000_000_110, 1_800_000_000_200)
    assert "first_ts_ms" not in document["segments"][1]
    assert Manifest.from_json(m.to_json()) == m
    untimed = json.loads(manifest([snap(10)], [seg(11, 20)]).to_json())
    assert "ts_ms" not in untimed["snapshots"][0] and "last_ts_ms" not in untimed["segments"][0]


def test_a_manifest_of_the_first_release_reads_with_unknown_times():
    """That release wrote no time fields; this one reads its manifests unchanged."""
    document = json.loads(manifest([snap(10)], [seg(11, 20)]).to_json())
    assert document["version"] == 1
    m = Manifest.from_json(json.dumps(document).encode())
    assert m.snapshots[0].ts_ms is None
    assert (m.segments[0].first_ts_ms, m.segments[0].last_ts_ms) == (None, None)


@pytest.mark.parametrize(
    "damage",
    [
        lambda d: d.pop("segments"),
        lambda d: d.update(format="something-else"),
        lambda d: d.update(seq=-1),
        lambda d: d["snapshots"].reverse(),
        lambda d: d["segments"][0].update(first=99),
        lambda d: d["snapshots"][0].update(index="10"),
        lambda d: d["snapshots"][0].update(ts_ms=-5),
        lambda d: d["segments"][0].update(first_ts_ms="yesterday"),
        lambda d: d["segments"][0].update(first_ts_ms=20, last_ts_ms=10),
    ],
    ids=["missing-field", "format", "negative", "unsorted", "inverted", "wrong-type",
         "negative-time", "time-not-a-number", "time-runs-backwards"],
)
def test_invalid_manifests_are_corrupt(damage):
    document = json.loads(manifest([snap(10), snap(20)], [seg(11, 20)]).to_json())
    damage(document)
    with pytest.raises(ArchiveCorrupt, match=r"x\.json"):
        Manifest.from_json(json.dumps(document).encode(), name="x.json")


def test_a_newer_format_version_says_which_flotilla_to_use():
    document = json.loads(manifest().to_json())
    document["version"] = 3
    with pytest.raises(ArchiveCorrupt, match="version 3"):
        Manifest.from_json(json.dumps(document).encode())


def fewest_segments(m: Manifest, base: int, target: int) -> int | None:
    """Breadth-first over 'covered up to' states: the dumb version of Manifest.chain."""
    frontier, seen, steps = {base}, {base}, 0
    while frontier:
        if any(covered >= target for covered in frontier):
            return steps
        steps += 1
        frontier = {
            s.last for c in frontier for s in m.segments if s.first <= c + 1 <= s.last
        } - seen
        seen |= frontier
    return None


spans = st.tuples(st.integers(1, 40), st.integers(0, 12)).map(lambda t: seg(t[0], t[0] + t[1]))


@given(st.lists(spans, max_size=12), st.integers(0, 40), st.integers(1, 55))
def test_chain_is_a_fewest_segment_cover_exactly_when_one_exists(segments, base, target):
    m = manifest([], segments)
    chain = m.chain(base, target)
    expected = fewest_segments(m, base, target) if target > base else 0
    if expected is None:
        assert chain is None
        assert m.reach(base) < target
        return
    assert chain is not None and len(chain) == expected
    covered = base
    for segment in chain:
        assert segment.first <= covered + 1 <= segment.last
        covered = segment.last
    assert covered >= target
    assert m.reach(base) >= target
