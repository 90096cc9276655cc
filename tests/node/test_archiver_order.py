"""The archiver never lets a snapshot move the archive past entries it has not shipped: the
archive then holds every index from 1 on, so any of them can be restored (docs/archive.md).

The leader here is the little of one the archiver reads (role, term, committed entries in a
log, the newest snapshot file); the archive is a real ``file://`` one.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

from flotilla.node.archive import ClusterArchive, open_archive
from flotilla.node.archiver import Archiver
from flotilla.node.consensus import Entry, Membership, SnapshotMeta
from flotilla.node.statemachine.kv import KVStateMachine
from flotilla.node.storage import SnapshotStore
from flotilla.node.storage.snapshots import StoredSnapshot

MEMBERSHIP = Membership(voters=frozenset({"n1"}), addresses=(("n1", "http://127.0.0.1:1"),))


class Leader:
    def __init__(self, root: Path) -> None:
        self.cfg = SimpleNamespace(archive_keep_snapshots=3, archive_interval_ms=200,
                                   archive_segment_entries=10000)
        self.log: list[Entry] = []
        self.committed = 0
        self.snapshots = SnapshotStore(root / "snap", fsync=False)
        self.snapshot: StoredSnapshot | None = None

    # --- what the archiver reads (archiver.ArchiveSource) ---

    def is_leader(self) -> bool:
        return True

    def term(self) -> int:
        return 1

    def commit_index(self) -> int:
        return self.committed

    def term_at(self, index: int) -> int | None:
        return self.log[index - 1].term if 0 < index <= len(self.log) else None

    def log_span(self) -> tuple[int, int]:
        return 1, len(self.log)

    def stored_first_index(self) -> int:
        return 1

    def stored_entries(self, lo: int, hi: int) -> list[Entry]:
        return self.log[lo - 1:hi - 1]

    def latest_snapshot(self) -> StoredSnapshot | None:
        return self.snapshot

    # --- the test's moves ---

    def commit(self, count: int) -> None:
        for _ in range(count):
            index = len(self.log) + 1
            self.log.append(Entry(index, 1, ts_ms=1_700_000_000_000 + index))
        self.committed = len(self.log)

    def take_snapshot(self) -> None:
        index = self.committed
        meta = SnapshotMeta(index, 1, MEMBERSHIP, self.log[index - 1].ts_ms)
        frozen = KVStateMachine().freeze()
        try:
            path = self.snapshots.save(meta, "kv", frozen.write)
        finally:
            frozen.release()
        self.snapshot = StoredSnapshot(meta, "kv", path)


class SlowUploads(ClusterArchive):
    """Runs ``during_upload`` once, while the first segment upload is under way."""

    during_upload = None

    def upload_segment(self, entries):
        record = super().upload_segment(entries)
        hook, self.during_upload = self.during_upload, None
        if hook is not None:
            hook()
        return record


def test_a_snapshot_taken_while_entries_upload_ships_after_the_entries_up_to_it(tmp_path):
    root = tmp_path / "archive"
    root.mkdir()
    leader = Leader(tmp_path)
    cluster = SlowUploads(open_archive(root.as_uri()), "c1")
    leader.commit(19)

    def meanwhile() -> None:  # more commits and a snapshot at 31, while 1..19 upload
        leader.commit(12)
        leader.take_snapshot()

    cluster.during_upload = meanwhile

    async def one_round() -> None:
        archiver = Archiver(leader, cluster, leader.cfg)
        await archiver.ship_now(31, 1)

    asyncio.run(one_round())
    manifest = cluster.manifest()
    assert manifest is not None
    assert [s.index for s in manifest.snapshots] == [31]
    spans = [(s.first, s.last) for s in manifest.segments]
    assert spans == [(1, 19), (20, 31)], spans
    assert manifest.restorable_ranges() == [(0, 31)], manifest.restorable_ranges()
    cluster.archive.close()
