"""An archive in the first release's formats (tests/fixtures/v1, written by that release) stays
readable: its manifests, segments and snapshot, and a restore plan over them. That release
recorded no times: its entries read back with time 0 and its manifests have no time fields."""

from __future__ import annotations

from flotilla.node.archive import ClusterArchive, open_archive
from flotilla.node.consensus import EntryKind
from flotilla.node.statemachine.kv import KVStateMachine
from flotilla.node.storage import SnapshotStore

from tests.fixtures import copy_v1, v1_expected


def v1_archive(tmp_path) -> ClusterArchive:
    root = copy_v1("archive", tmp_path / "archive")
    return ClusterArchive(open_archive(root.as_uri()), v1_expected()["cluster_id"])


def state_of(sm: KVStateMachine) -> dict[str, str]:
    return {key: sm.get(key)[0].decode() for key in sm.list()}


def test_the_v1_manifest_lists_what_was_archived(tmp_path):
    expected = v1_expected()
    cluster = v1_archive(tmp_path)
    manifest = cluster.manifest()
    assert manifest is not None
    assert [[s.first, s.last] for s in manifest.segments] == expected["archived_segments"]
    assert [s.index for s in manifest.snapshots] == [expected["snapshot_index"]]
    assert manifest.last_archived_index == expected["last_index"]
    assert all(s.first_ts_ms is None and s.last_ts_ms is None for s in manifest.segments)
    assert all(s.ts_ms is None for s in manifest.snapshots)


def test_v1_segments_decode_to_the_log(tmp_path):
    expected = v1_expected()
    cluster = v1_archive(tmp_path)
    manifest = cluster.manifest()
    indexes = []
    for segment in manifest.segments:
        entries = cluster.read_segment(segment)
        assert all(e.term == expected["term"] for e in entries)
        assert all(e.ts_ms == 0 for e in entries)
        indexes += [e.index for e in entries]
    assert indexes == list(range(1, expected["last_index"] + 1))


def test_a_v1_archive_restores_to_the_newest_state_and_to_an_index(tmp_path):
    expected = v1_expected()
    cluster = v1_archive(tmp_path)
    prepared = cluster.prepare_restore(tmp_path / "work")
    assert prepared.plan.index == expected["last_index"]
    assert prepared.snapshot_meta.index == expected["snapshot_index"]
    assert prepared.snapshot_meta.ts_ms == 0
    sm = KVStateMachine()
    with SnapshotStore(tmp_path / "snaps").open_payload(prepared.snapshot_path) as payload:
        sm.restore(payload)
    for entry in prepared.entries():
        if entry.kind == EntryKind.NORMAL:
            sm.apply(entry.index, entry.data)
    assert state_of(sm) == expected["state"]

    at = expected["first_archived_index"]
    prepared = cluster.prepare_restore(tmp_path / "work-at", at)
    assert prepared.snapshot_path is None and prepared.plan.index == at
    sm = KVStateMachine()
    for entry in prepared.entries():
        if entry.kind == EntryKind.NORMAL:
            sm.apply(entry.index, entry.data)
    assert state_of(sm) == expected["state_at_first_archived_index"]
