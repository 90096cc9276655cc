"""One cluster's archive (node/archive/cluster.py) on every backend: what a leader ships, what
retention keeps, and how a restore finds an intact way back to an index."""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from dataclasses import replace
from pathlib import Path

import pytest
from flotilla.node.archive import (
    ArchiveConflict,
    ArchiveCorrupt,
    ArchiveError,
    ArchiveNotFound,
    ClusterArchive,
    TimeOutsideArchive,
    list_clusters,
    resolve_cluster_id,
)
from flotilla.node.archive.layout import manifest_key, segment_key, snapshot_key
from flotilla.node.archive.segments import encode_segment
from flotilla.node.consensus.types import Entry, EntryKind, Membership, SnapshotMeta
from flotilla.node.storage import SnapshotStore

from tests.archive.stores import known_defect

MEMBERS = Membership(voters=frozenset({"a", "b", "c"}))
EPOCH_MS = 1_800_000_000_000


def ts(index: int) -> int:
    """The time of entry `index` in these tests' log."""
    return EPOCH_MS + 10 * index


def entries(first: int, last: int) -> list[Entry]:
    return [Entry(i, 2, EntryKind.NORMAL, f"put k{i}".encode(), ts(i))
            for i in range(first, last + 1)]


def make_snapshot(tmp_path: Path, index: int, term: int = 2) -> tuple[Path, SnapshotMeta]:
    """A real snapshot file, as a member's SnapshotStore writes it."""
    meta = SnapshotMeta(index, term, MEMBERS, ts(index))
    store = SnapshotStore(tmp_path / "snaps" / str(index), fsync=False)
    with store.begin(meta, "kv") as writer:
        writer.write(f"state at {index}".encode() * 50)
        path = writer.commit()
    return path, meta


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        self.now += 1
        return self.now


@pytest.fixture
def cluster(archive):
    return ClusterArchive(archive, "c1", clock=Clock())


def ship_history(cluster: ClusterArchive, tmp_path: Path) -> None:
    """Three publishes: segments 1..10 with no snapshot; snapshot 10 and segments to 22;
    snapshots 20 and 30 and segments to 40."""
    cluster.upload_segment(entries(1, 5))
    cluster.upload_segment(entries(6, 10))
    cluster.publish()
    cluster.upload_snapshot(*make_snapshot(tmp_path, 10))
    cluster.upload_segment(entries(11, 15))
    cluster.upload_segment(entries(16, 22))
    cluster.publish()
    cluster.upload_snapshot(*make_snapshot(tmp_path, 20))  # inside segment 16..22
    cluster.upload_segment(entries(23, 30))
    cluster.upload_snapshot(*make_snapshot(tmp_path, 30))
    cluster.upload_segment(entries(31, 40))
    cluster.publish()


def test_nothing_archived_yet(cluster):
    assert cluster.manifest() is None
    with pytest.raises(ArchiveNotFound, match="nothing is archived for cluster 'c1'"):
        cluster.plan_restore()


def test_a_published_manifest_lists_every_upload_and_how_far_it_reaches(cluster, tmp_path):
    ship_history(cluster, tmp_path)
    manifest = cluster.manifest()
    assert manifest.seq == 3
    assert [s.index for s in manifest.snapshots] == [10, 20, 30]
    assert [(s.first, s.last) for s in manifest.segments] == [
        (1, 5), (6, 10), (11, 15), (16, 22), (23, 30), (31, 40),
    ]
    assert manifest.last_archived_index == 40
    assert cluster.cached_manifest == manifest
    assert cluster.publish() == manifest  # nothing pending: nothing written


def test_the_manifest_records_the_time_range_of_each_segment_and_each_snapshots_time(
        cluster, tmp_path):
    ship_history(cluster, tmp_path)
    manifest = cluster.manifest()
    assert [(s.first_ts_ms, s.last_ts_ms) for s in manifest.segments] == [
        (ts(s.first), ts(s.last)) for s in manifest.segments]
    assert [s.ts_ms for s in manifest.snapshots] == [ts(10), ts(20), ts(30)]


def test_a_time_resolves_to_the_last_index_stamped_at_or_before_it(cluster, tmp_path):
    """Entry i is stamped EPOCH + 10 i: a time between two stamps inside a segment is pinned
    down by reading that segment; the bounds are refused naming the range."""
    ship_history(cluster, tmp_path)
    assert cluster.index_at_time(ts(10)) == 10  # a snapshot's time: exact from the manifest
    assert cluster.index_at_time(ts(13) + 5) == 13  # inside segment 11..15
    assert cluster.index_at_time(ts(13)) == 13
    assert cluster.index_at_time(ts(13), inclusive=False) == 12
    assert cluster.index_at_time(ts(40)) == 40
    with pytest.raises(TimeOutsideArchive, match=r"restorable times are .*\(index 1\) to .*"
                                                 r"\(index 40\)") as caught:
        cluster.index_at_time(ts(40) + 1)
    assert "after the last archived entry" in str(caught.value)
    with pytest.raises(TimeOutsideArchive, match="no archived entry is stamped at or before"):
        cluster.index_at_time(ts(1) - 1)


def test_a_time_cannot_be_resolved_without_a_manifest(cluster):
    with pytest.raises(ArchiveNotFound, match="no manifest"):
        cluster.index_at_time(ts(1))


def test_unknown_times_are_left_out_of_the_manifest(cluster, tmp_path):
    """Entries written before entries carried a time read back with time 0 (unknown)."""
    untimed = [replace(e, ts_ms=0) for e in entries(1, 5)]
    record = cluster.upload_segment([*untimed[:3], *entries(4, 5)])
    assert (record.first_ts_ms, record.last_ts_ms) == (None, ts(5))
    store = SnapshotStore(tmp_path / "untimed", fsync=False)
    path = store.save(SnapshotMeta(3, 2, MEMBERS), "kv", lambda writer: writer.write(b"s"))
    assert cluster.upload_snapshot(path, SnapshotMeta(3, 2, MEMBERS)).ts_ms is None
    published = json.loads(cluster.publish().to_json())
    assert "ts_ms" not in published["snapshots"][0]
    assert "first_ts_ms" not in published["segments"][0]


def test_a_segment_a_first_release_leader_uploaded_but_never_published_is_taken_as_it_is(
        cluster):
    """That leader wrote the same entries without times, then crashed (or lost office) before
    its manifest: the same range from this build is not a conflict, and the archive keeps the
    object that is there, with unknown times."""
    old = encode_segment("c1", [replace(e, ts_ms=0) for e in entries(1, 10)], version=1)
    cluster.archive.put_bytes(f"c1/{segment_key(1, 10)}", old)
    record = cluster.upload_segment(entries(1, 10))
    assert (record.first_ts_ms, record.last_ts_ms) == (None, None)
    assert record.sha256 == hashlib.sha256(old).hexdigest() and record.size == len(old)
    manifest = cluster.publish()
    assert manifest.segments == (record,)
    assert [e.ts_ms for e in cluster.read_segment(record)] == [0] * 10


def test_plans_start_from_the_newest_snapshot_at_or_below_the_index(cluster, tmp_path):
    ship_history(cluster, tmp_path)
    newest = cluster.plan_restore()
    assert (newest.index, newest.snapshot.index) == (40, 30)
    assert [(s.first, s.last) for s in newest.segments] == [(31, 40)]
    at_21 = cluster.plan_restore(21)
    assert at_21.snapshot.index == 20
    assert [e.index for e in cluster.read_segments(at_21)] == [21]
    at_3 = cluster.plan_restore(3)
    assert at_3.snapshot is None  # from the empty state
    assert list(cluster.read_segments(at_3)) == entries(1, 3)
    assert [p.base_index for p in cluster.restore_candidates(25)] == [20, 10, 0]
    with pytest.raises(ArchiveNotFound, match=r"beyond what .* holds .*newest archived index 40"):
        cluster.plan_restore(41)


def test_retention_keeps_exactly_what_the_newest_two_snapshots_need(
    backend, archive, cluster, tmp_path
):
    ship_history(cluster, tmp_path)
    result = cluster.retain(keep_snapshots=2, keep_manifests=3)
    remaining = set(archive.list_keys("c1/"))
    assert remaining == {
        f"c1/{key}" for key in (
            snapshot_key(20, 2), snapshot_key(30, 2),
            segment_key(16, 22), segment_key(23, 30), segment_key(31, 40),
            manifest_key(2), manifest_key(3), manifest_key(4),
        )
    }
    assert set(result.deleted) == {
        snapshot_key(10, 2), segment_key(1, 5), segment_key(6, 10), segment_key(11, 15),
        manifest_key(1),
    }
    assert result.manifest == cluster.manifest()
    assert result.manifest.retention_floor == 20
    assert result.manifest.last_archived_index == 40
    assert list(cluster.read_segments(cluster.plan_restore(21))) == entries(21, 21)
    with pytest.raises(ArchiveNotFound, match="older than the oldest kept snapshot"):
        cluster.plan_restore(15)
    assert cluster.retain(keep_snapshots=2).deleted == ()  # nothing more to do


def test_retention_removes_orphans_a_crash_left_below_the_kept_snapshots(
    archive, cluster, tmp_path
):
    ship_history(cluster, tmp_path)
    archive.put_bytes("c1/" + segment_key(2, 3), b"never published")
    archive.put_bytes("c1/" + segment_key(41, 50), b"maybe about to be published")
    deleted = cluster.retain(keep_snapshots=2).deleted
    assert segment_key(2, 3) in deleted
    assert archive.exists("c1/" + segment_key(41, 50))


def test_retention_never_resurrects_below_its_floor(archive, tmp_path):
    leader = ClusterArchive(archive, "c1")
    leader.upload_segment(entries(1, 10))
    leader.publish()
    old_leader = ClusterArchive(archive, "c1")
    old_leader.upload_segment(entries(11, 13))  # shipped, then it lost leadership
    leader.upload_snapshot(*make_snapshot(tmp_path, 10))
    leader.upload_segment(entries(11, 20))
    leader.upload_snapshot(*make_snapshot(tmp_path, 20))
    leader.publish()
    leader.retain(keep_snapshots=1)
    published = old_leader.publish()  # seq 2 is taken: it merges into the retained manifest
    assert published == leader.manifest()
    assert published.retention_floor == 20
    assert [(s.first, s.last) for s in published.segments] == []
    assert old_leader.publish() == published  # and nothing is left pending


def test_a_segment_must_not_leave_a_gap_or_overlap(cluster, tmp_path):
    with pytest.raises(ArchiveError, match="gap"):
        cluster.upload_segment(entries(5, 9))  # nothing ends at 4
    cluster.upload_segment(entries(1, 10))
    with pytest.raises(ArchiveError, match=r"overlaps segment 1\.\.10"):
        cluster.upload_segment(entries(8, 12))
    with pytest.raises(ArchiveError, match="gap"):
        cluster.upload_segment(entries(12, 15))
    again = cluster.upload_segment(entries(1, 10))  # an exact repeat is idempotent
    assert (again.first, again.last) == (1, 10)
    cluster.upload_snapshot(*make_snapshot(tmp_path, 20))  # the log was compacted past 11..20
    cluster.upload_segment(entries(21, 25))  # continues from the snapshot
    manifest = cluster.publish()
    assert manifest.restorable_ranges() == [(0, 10), (20, 25)]


def test_a_segment_with_other_entries_under_an_archived_range_is_a_conflict(cluster):
    cluster.upload_segment(entries(1, 10))
    cluster.publish()
    changed = [*entries(1, 9), Entry(10, 3, EntryKind.NORMAL, b"different")]
    with pytest.raises(ArchiveConflict):
        cluster.upload_segment(changed)


def test_a_snapshot_must_match_its_metadata(cluster, tmp_path):
    path, meta = make_snapshot(tmp_path, 10)
    with pytest.raises(ValueError, match="index 10 term 2, not index 11"):
        cluster.upload_snapshot(path, SnapshotMeta(11, 2, MEMBERS))
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(ArchiveError, match="damaged snapshot"):
        cluster.upload_snapshot(path, meta)


def test_a_downloaded_snapshot_reads_back_with_the_snapshot_reader(cluster, tmp_path):
    path, meta = make_snapshot(tmp_path, 10)
    record = cluster.upload_snapshot(path, meta)
    assert cluster.location(record) == cluster.archive.url_for("c1/" + record.key)
    cluster.publish()
    dest = tmp_path / "restored.snap"
    got = cluster.download_snapshot(cluster.plan_restore(10).snapshot, dest)
    assert got == meta
    reader = SnapshotStore(tmp_path / "unused", fsync=False).open_payload(dest)
    with reader:
        assert reader.read() == b"state at 10" * 50
    assert dest.read_bytes() == path.read_bytes()


def test_two_writers_never_publish_the_same_seq(backend, archive, tmp_path):
    if not backend.honours_if_none_match:
        pytest.skip(f"{backend.name} ignores If-None-Match (documented)")
    first = ClusterArchive(archive, "c1")
    second = ClusterArchive(archive, "c1")
    first.upload_segment(entries(1, 10))
    second.upload_segment(entries(1, 10))  # both start from an empty archive
    second.upload_segment(entries(11, 20))
    assert first.publish().seq == 1
    merged = second.publish()  # seq 1 is taken: reload, merge, publish 2
    assert merged.seq == 2
    assert [(s.first, s.last) for s in merged.segments] == [(1, 10), (11, 20)]
    stale = merged.merged(seq=2, created="now", segments=[])
    with pytest.raises(ArchiveConflict, match="manifest 2"):
        first.publish(with_other_bytes(stale))


def with_other_bytes(manifest):
    """The same records under a different creation time: other bytes for the same seq."""
    return replace(manifest, created="1999-01-01T00:00:00Z")


def test_a_damaged_newest_manifest_falls_back_and_is_never_reused(
    backend, archive, cluster, caplog
):
    cluster.upload_segment(entries(1, 5))
    cluster.publish()
    cluster.upload_segment(entries(6, 10))
    cluster.publish()
    backend.overwrite("c1/" + manifest_key(2), b"{ not json")
    fresh = ClusterArchive(archive, "c1")
    with caplog.at_level(logging.WARNING):
        assert fresh.manifest().seq == 1
    assert "falling back" in caplog.text
    fresh.upload_segment(entries(6, 10))
    assert fresh.publish().seq == 3


def test_restore_falls_back_to_an_older_snapshot_when_an_object_is_corrupt(
    backend, cluster, tmp_path, caplog
):
    cluster.upload_snapshot(*make_snapshot(tmp_path, 10))
    cluster.upload_segment(entries(11, 20))
    twenty = cluster.upload_snapshot(*make_snapshot(tmp_path, 20))
    cluster.upload_segment(entries(21, 30))
    cluster.publish()
    backend.overwrite("c1/" + twenty.key, b"rotten", digest=twenty.sha256)
    with pytest.raises(ArchiveCorrupt):
        cluster.download_snapshot(twenty, tmp_path / "direct.snap")
    with caplog.at_level(logging.WARNING):
        prepared = cluster.prepare_restore(tmp_path / "work", index=25)
    assert prepared.plan.snapshot.index == 10
    assert prepared.snapshot_meta == SnapshotMeta(10, 2, MEMBERS, ts(10))
    assert prepared.snapshot_path.name == "snap-0000000000000010-0000000000000002.snap"
    assert list(prepared.entries()) == entries(11, 25)
    assert "restoring from an older snapshot instead" in caplog.text


def test_restore_fails_clearly_when_nothing_intact_remains(backend, cluster, tmp_path):
    cluster.upload_snapshot(*make_snapshot(tmp_path, 10))
    segment = cluster.upload_segment(entries(11, 20))
    cluster.publish()
    backend.overwrite("c1/" + segment.key, b"rotten", digest=segment.sha256)
    with pytest.raises(ArchiveCorrupt, match="no intact way to rebuild index 20") as caught:
        cluster.prepare_restore(tmp_path / "work")
    assert segment.key in str(caught.value)
    assert list((tmp_path / "work").glob("*.snap")) == []  # nothing half-prepared left behind
    assert cluster.prepare_restore(tmp_path / "work", index=10).plan.segments == ()


def test_a_deleted_object_is_worked_around_like_a_corrupt_one(archive, cluster, tmp_path):
    cluster.upload_snapshot(*make_snapshot(tmp_path, 10))
    cluster.upload_segment(entries(11, 20))
    twenty = cluster.upload_snapshot(*make_snapshot(tmp_path, 20))
    cluster.publish()
    archive.delete("c1/" + twenty.key)
    prepared = cluster.prepare_restore(tmp_path / "work")
    assert (prepared.plan.index, prepared.plan.snapshot.index) == (20, 10)


def test_clusters_are_listed_and_the_only_one_is_the_default(backend, archive, request):
    known_defect(request, backend, "s3rver", "answers Delimiter listings without CommonPrefixes")
    assert list_clusters(archive) == []
    with pytest.raises(ArchiveNotFound, match="holds no archived cluster"):
        resolve_cluster_id(archive)
    one = ClusterArchive(archive, "alpha")
    one.upload_segment(entries(1, 3))
    one.publish()
    archive.put_bytes("beta/segments/unpublished", b"x")  # no manifest: not a cluster yet
    assert list_clusters(archive) == ["alpha"]
    assert resolve_cluster_id(archive) == "alpha"
    two = ClusterArchive(archive, "gamma")
    two.upload_segment(entries(1, 3))
    two.publish()
    with pytest.raises(ArchiveError, match=r"several clusters \(alpha, gamma\).*--restore-cluster"):
        resolve_cluster_id(archive)
    assert resolve_cluster_id(archive, "gamma") == "gamma"
    with pytest.raises(ArchiveNotFound, match="no cluster 'delta'"):
        resolve_cluster_id(archive, "delta")


def test_uploads_from_several_threads_all_land_in_one_manifest(cluster, tmp_path):
    snapshots = [make_snapshot(tmp_path, index) for index in (10, 20, 30, 40)]
    errors: list[BaseException] = []

    def ship(path, meta) -> None:
        try:
            cluster.upload_snapshot(path, meta)
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=ship, args=pair) for pair in snapshots]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert [s.index for s in cluster.publish().snapshots] == [10, 20, 30, 40]


@pytest.mark.parametrize("bad", ["", "a/b", "..", ".hidden", "x" * 200])
def test_cluster_ids_must_be_one_safe_path_segment(archive, bad):
    with pytest.raises(ValueError, match="cluster id"):
        ClusterArchive(archive, bad)


def test_the_last_archived_term_is_read_from_the_segment_or_snapshot_that_ends_there(
        archive, tmp_path):
    cluster = ClusterArchive(archive, "c1")
    cluster.upload_snapshot(*make_snapshot(tmp_path, 10, term=4))
    manifest = cluster.publish()
    assert cluster.last_archived_term(manifest) == 4
    cluster.upload_segment([*entries(11, 14), Entry(15, 5, EntryKind.NOOP, b"", 0)])
    assert cluster.last_archived_term(cluster.publish()) == 5
