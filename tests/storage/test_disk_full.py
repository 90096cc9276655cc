"""A full disk fails the write with DiskFullError (the file, and the bytes still free), stops
the log for good, and loses nothing that was synced: on a real, small file system (a tmpfs
mounted for the test; skipped where mounting is not allowed)."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

import pytest
from flotilla.node.consensus.types import Entry, HardState, Membership, SnapshotMeta
from flotilla.node.storage import DiskFullError, DiskStorage, StorageFailedError, free_bytes

from tests.harness.tmpfs import small_filesystem
from tests.storage.storage_testlib import CLUSTER, newest_segment

VALUE = b"v" * 8000


def fill(path: Path) -> None:
    """Write `path` until the file system holding it has no byte left."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        while True:
            try:
                os.write(fd, b"\0" * 4096)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                return
    finally:
        os.close(fd)


def test_a_full_disk_fails_the_append_and_loses_nothing_synced(tmp_path):
    with small_filesystem(tmp_path / "vol", "1m") as volume:
        data = volume.path / "n1"
        log = DiskStorage(data, cluster_id=CLUSTER)
        log.install_snapshot(SnapshotMeta(0, 0, Membership(voters=frozenset({"n1"}))))
        synced = 0
        with pytest.raises(DiskFullError) as caught:
            for index in range(1, 1000):
                log.append([Entry(index, 1, 0, VALUE)])
                log.sync()
                synced = index
        assert 50 < synced < 200
        full = caught.value
        assert full.path == str(newest_segment(data))
        assert full.data_dir == str(data)
        assert full.free is not None and full.free < len(VALUE)
        assert re.fullmatch(
            rf"no space left on device writing {re.escape(str(newest_segment(data)))}: "
            rf"{full.free} bytes free on the file system of {re.escape(str(data))}; free space "
            r"there or grow the volume, then restart the member \(nothing acknowledged was "
            r"lost\)", str(full))
        with pytest.raises(StorageFailedError):  # what is on disk is unknown from here on
            log.append([Entry(synced + 1, 1, 0, b"x")])
        log.close()

        volume.resize("4m")
        reopened = DiskStorage(data, cluster_id=CLUSTER)
        assert reopened.last_index() == synced  # the torn record is cut, nothing synced lost
        assert all(e.data == VALUE for e in reopened.entries(1, synced + 1))
        reopened.append([Entry(synced + 1, 1, 0, b"after")])
        reopened.sync()
        reopened.close()


def test_a_hard_state_that_does_not_fit_is_a_full_disk_and_the_old_one_stays(tmp_path):
    with small_filesystem(tmp_path / "vol", "256k") as volume:
        data = volume.path / "n1"
        log = DiskStorage(data, cluster_id=CLUSTER)
        log.save_hard_state(HardState(1, "n1"))
        fill(volume.path / "filler")
        assert free_bytes(volume.path) == 0
        with pytest.raises(DiskFullError) as caught:
            log.save_hard_state(HardState(2, "n2"))
        assert caught.value.path == str(data / "hardstate")
        assert caught.value.free == 0
        log.close()
        assert not list(data.glob("*.tmp")), "the half-written copy is removed"
        (volume.path / "filler").unlink()
        assert DiskStorage(data, cluster_id=CLUSTER).recover().hard_state == HardState(1, "n1")
