"""From a time to an index (node/archive/timeindex.py), from the manifest alone and at most one
segment's entries: worked examples, then a check against the dumb answer (scan the whole log)
on random logs and archives."""

from __future__ import annotations

import itertools

import pytest
from flotilla.node.archive import ArchiveCorrupt, ArchiveNotFound, Manifest, SegmentRecord
from flotilla.node.archive.layout import segment_key, snapshot_key
from flotilla.node.archive.manifest import SnapshotRecord
from flotilla.node.archive.timeindex import (
    TimeOutsideArchive,
    TimeTarget,
    format_ms,
    locate,
    parse_time,
    restorable_time_range,
    restorable_times,
)
from flotilla.node.consensus.types import Entry
from hypothesis import given, settings
from hypothesis import strategies as st

T0 = 1_795_000_000_000  # 2026-11-18T11:06:40Z


class Log:
    """A log whose entry i (1-based) is stamped `times[i - 1]`, and records of it."""

    def __init__(self, times: list[int]) -> None:
        assert times == sorted(times)
        self.times = times

    def ts(self, index: int) -> int:
        return self.times[index - 1]

    def entries(self, first: int, last: int) -> list[Entry]:
        return [Entry(i, 1, 0, b"", self.ts(i)) for i in range(first, last + 1)]

    def seg(self, first: int, last: int, *, timed: bool = True) -> SegmentRecord:
        return SegmentRecord(first, last, segment_key(first, last), 10, "b" * 64,
                             self.ts(first) if timed else None,
                             self.ts(last) if timed else None)

    def snap(self, index: int, *, timed: bool = True) -> SnapshotRecord:
        return SnapshotRecord(index, 1, snapshot_key(index, 1), 10, "a" * 64,
                              self.ts(index) if timed else None)

    def manifest(self, snapshots=(), segments=(), floor: int = 0) -> Manifest:
        return Manifest.create("c1", 1, "2026-01-01T00:00:00Z", snapshots, segments, floor)

    def resolve(self, target: TimeTarget) -> int:
        segment = target.segment
        return target.resolve(self.entries(segment.first, segment.last) if segment else [])


# 20 entries: 10 ms apart, with three entries sharing each of T0+100 and T0+150.
TIMES = [T0 + 10 * i for i in range(10)] + [T0 + 100] * 3 + [T0 + 150] * 3 + [
    T0 + 200 + i for i in range(4)]
LOG = Log(TIMES)


def test_times_are_written_as_rfc_3339_in_utc_with_milliseconds():
    assert format_ms(0) == "1970-01-01T00:00:00.000Z"
    assert format_ms(1_795_000_000_250) == "2026-11-18T11:06:40.250Z"


def test_a_time_at_a_segment_boundary_resolves_without_reading_anything():
    m = LOG.manifest([], [LOG.seg(1, 5), LOG.seg(6, 10), LOG.seg(11, 20)])
    target = locate(m, LOG.ts(5))
    assert target.exact and target.index == 5
    assert locate(m, LOG.ts(5) + 3).index == 5  # before entry 6's time
    at_6 = locate(m, LOG.ts(6))  # entries after 6 might share its time: read 6..10
    assert (at_6.low, at_6.high, at_6.segment) == (6, 9, LOG.seg(6, 10))
    assert LOG.resolve(at_6) == 6


def test_a_time_inside_a_segment_names_the_one_segment_to_read():
    m = LOG.manifest([], [LOG.seg(1, 10), LOG.seg(11, 20)])
    target = locate(m, T0 + 35)
    assert (target.low, target.high, target.segment) == (1, 9, LOG.seg(1, 10))
    assert LOG.resolve(target) == 4  # stamped T0+30; entry 5 is T0+40


def test_entries_stamped_in_the_same_millisecond_all_count():
    m = LOG.manifest([], [LOG.seg(1, 12), LOG.seg(13, 20)])  # 11..13 share one millisecond
    assert LOG.resolve(locate(m, T0 + 100)) == 13
    assert LOG.resolve(locate(m, T0 + 150)) == 16


def test_the_first_restorable_point_is_the_oldest_snapshot_when_older_history_is_gone():
    m = LOG.manifest([LOG.snap(8), LOG.snap(14)], [LOG.seg(1, 8), LOG.seg(9, 14),
                                                   LOG.seg(15, 20)], floor=8)
    assert restorable_time_range(m).first.index == 8
    assert restorable_time_range(m).describe() == (
        f"{format_ms(LOG.ts(8))} (index 8) to {format_ms(LOG.ts(20))} (index 20)")
    with pytest.raises(TimeOutsideArchive) as caught:
        locate(m, LOG.ts(7), url="s3://b/p/c1")
    message = str(caught.value)
    assert format_ms(LOG.ts(7)) in message and "s3://b/p/c1" in message
    assert f"restorable times are {format_ms(LOG.ts(8))} (index 8) to" in message
    assert isinstance(caught.value, ArchiveNotFound)
    assert locate(m, LOG.ts(8)).index == 8


def test_the_first_restorable_point_without_a_snapshot_is_the_first_archived_entry():
    m = LOG.manifest([], [LOG.seg(1, 20)])
    assert restorable_time_range(m).first.index == 1
    with pytest.raises(TimeOutsideArchive, match="no archived entry is stamped at or before"):
        locate(m, T0 - 1)


def test_the_last_archived_entrys_time_is_the_end_of_the_range_inclusive():
    m = LOG.manifest([], [LOG.seg(1, 10), LOG.seg(11, 18)])
    assert restorable_time_range(m).last.index == 18
    assert locate(m, LOG.ts(18)).index == 18
    with pytest.raises(TimeOutsideArchive, match="after the last archived entry") as caught:
        locate(m, LOG.ts(18) + 1)
    assert caught.value.ranges == restorable_times(m)


def test_a_time_in_a_gap_of_the_archive_is_refused_naming_both_runs():
    # 9..13 were never archived; the snapshot at 14 bridges the gap
    m = LOG.manifest([LOG.snap(14)], [LOG.seg(1, 8), LOG.seg(15, 20)])
    assert [(r.first.index, r.last.index) for r in restorable_times(m)] == [(1, 8), (14, 20)]
    with pytest.raises(TimeOutsideArchive, match="falls between index 8") as caught:
        locate(m, LOG.ts(10))
    assert "(index 8); " in str(caught.value) and "(index 14) to" in str(caught.value)
    assert locate(m, LOG.ts(8)).index == 8
    assert LOG.resolve(locate(m, LOG.ts(14))) == 16  # 14..16 share one millisecond


def test_an_exclusive_target_is_the_last_entry_stamped_before_it():
    m = LOG.manifest([], [LOG.seg(1, 20)])
    assert LOG.resolve(locate(m, T0 + 150, inclusive=False)) == 13
    assert LOG.resolve(locate(m, T0 + 151, inclusive=False)) == 16
    with pytest.raises(TimeOutsideArchive, match="stamped before it"):
        locate(m, T0, inclusive=False)


def test_an_archive_with_no_times_cannot_be_targeted_by_time():
    m = LOG.manifest([LOG.snap(10, timed=False)], [LOG.seg(1, 10, timed=False)])
    assert restorable_time_range(m) is None
    with pytest.raises(TimeOutsideArchive, match="records no entry times"):
        locate(m, T0 + 50)


def test_entries_of_unknown_time_are_never_guessed_at():
    """After an upgrade from the first release, an archive holds a stretch of entries with no
    time: a target that would need one is refused, one past it is answered."""
    log = Log(TIMES)
    untimed = SegmentRecord(1, 10, segment_key(1, 10), 10, "b" * 64, None, None)
    m = log.manifest([], [untimed, log.seg(11, 20)])
    assert restorable_time_range(m).first.index == 11
    with pytest.raises(TimeOutsideArchive):
        locate(m, T0 + 50)
    assert locate(m, T0 + 100).low == 11
    mixed = SegmentRecord(1, 20, segment_key(1, 20), 10, "b" * 64, None, log.ts(20))
    target = locate(log.manifest([log.snap(5)], [mixed]), T0 + 150)
    assert (target.low, target.high) == (5, 19)
    entries = [Entry(i, 1, 0, b"", 0 if i <= 10 else log.ts(i)) for i in range(1, 21)]
    with pytest.raises(TimeOutsideArchive, match="entry 6 has no recorded time"):
        target.resolve(entries)


def test_records_that_disagree_about_a_time_are_corrupt():
    m = LOG.manifest([LOG.snap(10)], [SegmentRecord(1, 10, segment_key(1, 10), 1, "b" * 64,
                                                    LOG.ts(1), LOG.ts(10) + 1)])
    with pytest.raises(ArchiveCorrupt, match="index 10 two times"):
        locate(m, T0)


def test_resolving_needs_the_entries_of_the_whole_bracket():
    m = LOG.manifest([], [LOG.seg(1, 20)])
    target = locate(m, T0 + 35)
    with pytest.raises(ValueError, match="cover"):
        target.resolve(LOG.entries(1, 3))
    with pytest.raises(ValueError, match="resolve"):
        _ = target.index


# --- against the dumb answer -------------------------------------------------------------


@st.composite
def archives(draw):
    """A random log and an archive of it: segments with gaps and overlaps, snapshots, maybe a
    retention floor. Times grow by 0-3 ms per entry, so many are shared."""
    length = draw(st.integers(1, 40))
    steps = draw(st.lists(st.integers(0, 3), min_size=length, max_size=length))
    log = Log([T0 + s for s in itertools.accumulate(steps)])
    cuts = sorted(draw(st.sets(st.integers(1, length), max_size=8)) | {length})
    segments, first = [], 1
    for last in cuts:
        if draw(st.booleans()) or draw(st.booleans()):  # most chunks are archived
            segments.append(log.seg(first, last))
        if draw(st.integers(0, 5)) == 0 and first > 1:  # another leader's overlapping copy
            segments.append(log.seg(first - 1, last))
        first = last + 1
    snapshots = [log.snap(i) for i in draw(st.sets(st.integers(1, length), max_size=4))]
    floor = draw(st.sampled_from([0, *(s.index for s in snapshots)]))
    return log, log.manifest(snapshots, segments, floor)


@settings(max_examples=300, deadline=None)
@given(archives())
def test_locate_answers_exactly_what_scanning_the_log_gives(archive):
    log, m = archive
    restorable = {i for low, high in m.restorable_ranges() for i in range(max(low, 1), high + 1)}
    runs = restorable_times(m)
    length = len(log.times)
    for t in range(T0 - 2, log.times[-1] + 3):
        inside_a_run = any(r.first.ts_ms <= t <= r.last.ts_ms for r in runs)
        try:
            target = locate(m, t)
        except TimeOutsideArchive as exc:
            assert not inside_a_run, (t, runs)
            assert "restorable times are" in str(exc)
            continue
        n = log.resolve(target)
        assert target.low <= n <= target.high
        # Sound: restorable, stamped at or before t, and the next entry is later or is one
        # the archive cannot know about.
        assert n in restorable and log.ts(n) <= t
        assert n == length or log.ts(n + 1) > t or n + 1 not in restorable, (t, n)
        # Only one segment is read, and only when needed.
        assert target.exact == (target.segment is None)
        assert locate(m, t + 1, inclusive=False) == locate(m, t)
    if runs:
        overall = restorable_time_range(m)
        assert overall.first == runs[0].first and overall.last == runs[-1].last
        assert overall.first.index == min(restorable)
        assert overall.last.index == m.last_archived_index


@pytest.mark.parametrize(("text", "expected"), [
    ("2026-11-18T11:06:40Z", T0),
    ("2026-11-18T11:06:40.250Z", T0 + 250),
    ("2026-11-18t11:06:40.2509z", T0 + 250),  # past the millisecond: dropped, never rounded up
    ("2026-11-18 12:06:40.5+01:00", T0 + 500),
    ("2026-11-18T06:06:40-05:00", T0),
])
def test_rfc_3339_times_are_read_to_the_millisecond(text, expected):
    assert parse_time(text) == expected
    assert parse_time(format_ms(expected)) == expected


@pytest.mark.parametrize("text", [
    "2026-11-18T11:06:40",  # no offset: a different instant on every machine
    "2026-11-18", "yesterday", "1795000000000", "2026-13-01T00:00:00Z",
    "2026-02-30T00:00:00Z", "1969-12-31T23:59:59Z",
])
def test_a_time_that_is_not_rfc_3339_with_an_offset_is_refused_with_an_example(text):
    with pytest.raises(ValueError, match=r"2026-11-25T17:00:00.250Z|not a valid time|before 1970"):
        parse_time(text)
