"""Files in the first release's formats (tests/fixtures/v1, written by that release) stay
readable: the write-ahead log, the log start, the hard state and the snapshot of its data dir.
That release stored no times: its entries and snapshot read back with time 0 (unknown)."""

from __future__ import annotations

from pathlib import Path

from flotilla.node.consensus import Entry, EntryKind
from flotilla.node.statemachine.kv import KVStateMachine
from flotilla.node.storage import DataDir, DiskStorage, SnapshotStore

from tests.fixtures import copy_v1, v1_expected


def open_v1(tmp_path: Path) -> tuple[Path, DiskStorage]:
    expected = v1_expected()
    data_dir = copy_v1("datadir", tmp_path / "datadir")
    DataDir.open(data_dir, cluster_id=expected["cluster_id"], member_name=expected["member"])
    return data_dir, DiskStorage(data_dir, cluster_id=expected["cluster_id"])


def test_the_v1_log_is_recovered_whole(tmp_path):
    expected = v1_expected()
    _, storage = open_v1(tmp_path)
    try:
        recovered = storage.recover()
        assert recovered.hard_state.term == expected["term"]
        assert recovered.hard_state.vote == expected["member"]
        assert recovered.snapshot.index == expected["snapshot_index"]
        assert expected["member"] in recovered.snapshot.membership.voters
        assert storage.first_index() == expected["first_index"]
        assert storage.last_index() == expected["last_index"]
        entries = storage.entries(storage.first_index(), storage.last_index() + 1)
        assert [e.index for e in entries] == list(range(expected["first_index"],
                                                        expected["last_index"] + 1))
        assert all(e.term == expected["term"] for e in entries)
        assert all(e.kind == EntryKind.NORMAL for e in entries)
        assert all(e.ts_ms == 0 for e in entries)
        assert recovered.snapshot.ts_ms == 0
        assert [e.index for e in recovered.entries] == list(
            range(expected["snapshot_index"] + 1, expected["last_index"] + 1))
    finally:
        storage.close()


def test_the_v1_snapshot_plus_the_log_give_the_recorded_state(tmp_path):
    expected = v1_expected()
    data_dir, storage = open_v1(tmp_path)
    try:
        found = SnapshotStore(data_dir / "snap").load_latest(_restored)
        assert found is not None
        stored, sm = found
        assert stored.meta.index == expected["snapshot_index"]
        assert stored.meta.term == expected["term"]
        assert stored.meta.ts_ms == 0
        for entry in storage.recover().entries:
            sm.apply(entry.index, entry.data)
        assert {k: sm.get(k)[0].decode() for k in sm.list()} == expected["state"]
    finally:
        storage.close()


def test_a_v1_log_takes_new_entries_with_times_and_recovers_them(tmp_path):
    expected = v1_expected()
    data_dir, storage = open_v1(tmp_path)
    last = expected["last_index"]
    try:
        old = storage.entries(expected["first_index"], last + 1)
        more = [Entry(e.index + 5, e.term + 1, e.kind, e.data, 1_800_000_000_000 + e.index)
                for e in storage.entries(last - 4, last + 1)]
        storage.append(more)
        storage.sync()
        storage.compact(last + 2, retain_after=expected["first_index"] - 1)  # a new log start
    finally:
        storage.close()
    reopened = DiskStorage(data_dir, cluster_id=expected["cluster_id"])
    try:
        assert reopened.last_index() == last + 5
        assert reopened.entries(expected["first_index"], last + 6) == old + more
        assert reopened.recover().snapshot.ts_ms == more[1].ts_ms
    finally:
        reopened.close()


def _restored(payload) -> KVStateMachine:
    sm = KVStateMachine()
    sm.restore(payload)
    return sm
