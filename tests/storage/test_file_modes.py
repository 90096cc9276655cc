"""What a member writes is its own: files 0600 (sealed segments 0400), directories 0700.

The modes are given explicitly, so they hold whatever the umask (these tests run with 022,
which would leave 0644 and 0755). The running node is checked in tests/node/test_disk_refusals.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from flotilla.node.archive.filesystem import FileArchive
from flotilla.node.consensus.types import Entry, HardState, Membership, SnapshotMeta
from flotilla.node.storage import (
    DataDir,
    DiskStorage,
    SnapshotStore,
    lock_data_dir,
    write_admission,
)
from flotilla.node.storage.fsutil import make_private

from tests.storage.storage_testlib import CLUSTER


@pytest.fixture(autouse=True)
def permissive_umask() -> Iterator[None]:
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def modes(root: Path) -> dict[str, int]:
    found = {".": root.stat().st_mode & 0o777}
    found.update({str(p.relative_to(root)): p.stat().st_mode & 0o777 for p in root.rglob("*")})
    return found


def test_a_data_dir_holds_only_private_files_and_directories(tmp_path):
    root = tmp_path / "deep" / "n1"  # the parents it creates are private too
    lock = lock_data_dir(root)
    data_dir = DataDir.open(root, cluster_id=CLUSTER, member_name="n1")
    write_admission(root, ("undecided", 3))
    log = DiskStorage(root, cluster_id=CLUSTER, segment_bytes=4096)
    membership = Membership(voters=frozenset({"n1"}))
    log.install_snapshot(SnapshotMeta(0, 0, membership))
    log.save_hard_state(HardState(1, "n1"))
    log.append([Entry(i, 1, 0, b"x" * 200) for i in range(1, 60)])
    log.sync()
    store = SnapshotStore(data_dir.snapshot_dir)
    store.save(SnapshotMeta(30, 1, membership), "kv", lambda writer: writer.write(b"state"))
    log.compact(30)
    log.close()
    lock.release()

    found = modes(root)
    sealed = {str(p.relative_to(root)) for p in sorted((root / "wal").glob("*.seg"))[:-1]}
    assert sealed, "the test needs a sealed segment"
    assert {name for name, mode in found.items() if (root / name).is_dir()} == {
        ".", "wal", "snap"}
    for name, mode in found.items():
        expected = 0o700 if (root / name).is_dir() else 0o400 if name in sealed else 0o600
        assert mode == expected, f"{name} has mode {mode:o}, not {expected:o}"
    assert (tmp_path / "deep").stat().st_mode & 0o777 == 0o700


def test_an_open_data_dir_of_ours_is_closed_to_others_and_someone_elses_left_alone(tmp_path):
    """A data dir an older build made with the umask's 0755 is closed at the next start (the
    node calls this once storage has found nothing to refuse); a directory owned by another
    user, such as a volume's mount point, keeps its mode."""
    ours = tmp_path / "ours"
    ours.mkdir(mode=0o755)
    assert make_private(ours)
    assert ours.stat().st_mode & 0o777 == 0o700
    assert not make_private(ours)  # already private: nothing to do
    if os.geteuid() != 0:
        pytest.skip("giving a directory to another user needs root")
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, 65534, -1)
    assert not make_private(theirs)
    assert theirs.stat().st_mode & 0o777 == 0o755


def test_a_local_archive_holds_only_private_files_and_directories(tmp_path):
    archive = FileArchive(tmp_path / "archive")
    archive.put_bytes("c1/segments/0001.seg", b"entries")
    source = tmp_path / "snapshot"
    source.write_bytes(b"state")
    archive.put_file("c1/snapshots/0001.snap", source)
    found = modes(tmp_path / "archive")
    assert found == {
        ".": 0o700, "c1": 0o700, "c1/segments": 0o700, "c1/snapshots": 0o700,
        "c1/segments/0001.seg": 0o600, "c1/segments/0001.seg.sha256": 0o600,
        "c1/snapshots/0001.snap": 0o600, "c1/snapshots/0001.snap.sha256": 0o600,
    }
