"""The hot path's promises: one os.write per append call, one fsync per sync however many
entries it covers, none when there is nothing new, and sync() safe in a worker thread while
the owner keeps appending (which is how a runtime overlaps the disk with everything else)."""

from __future__ import annotations

import os
import threading

from flotilla.node.storage import DiskStorage
from flotilla.node.storage import wal as wal_module

from tests.storage.storage_testlib import CLUSTER, entries


class SyscallCounter:
    def __init__(self, monkeypatch) -> None:
        self.writes = self.datasyncs = self.dir_fsyncs = 0
        real_write = os.write
        real_datasync, real_fsync_dir = wal_module.datasync, wal_module.fsync_dir

        def write(fd, data):
            self.writes += 1
            return real_write(fd, data)

        def datasync(fd):
            self.datasyncs += 1
            real_datasync(fd)

        def fsync_dir(path):
            self.dir_fsyncs += 1
            real_fsync_dir(path)

        monkeypatch.setattr(os, "write", write)
        monkeypatch.setattr(wal_module, "datasync", datasync)
        monkeypatch.setattr(wal_module, "fsync_dir", fsync_dir)

    def reset(self) -> None:
        self.writes = self.datasyncs = self.dir_fsyncs = 0


def test_an_append_is_one_write_and_a_sync_is_one_fsync(tmp_path, monkeypatch):
    log = DiskStorage(tmp_path, cluster_id=CLUSTER)
    count = SyscallCounter(monkeypatch)
    log.append(entries(1, 101, term=1))
    assert (count.writes, count.datasyncs, count.dir_fsyncs) == (1, 0, 0)
    log.append(entries(101, 111, term=1))
    log.sync()
    assert (count.writes, count.datasyncs, count.dir_fsyncs) == (2, 1, 0)
    count.reset()
    log.sync()  # nothing new: no fsync at all
    assert (count.writes, count.datasyncs, count.dir_fsyncs) == (0, 0, 0)


def test_a_sync_after_rotation_also_makes_the_new_segment_durable(tmp_path, monkeypatch):
    log = DiskStorage(tmp_path, cluster_id=CLUSTER, segment_bytes=1000)
    log.append(entries(1, 11, term=1))
    log.sync()
    count = SyscallCounter(monkeypatch)
    log.append(entries(11, 61, term=1))  # crosses segment boundaries
    rotations = len(list((tmp_path / "wal").glob("*.seg"))) - 1
    assert rotations >= 1
    # per rotation: seal the old segment, make the new header durable before it is renamed in
    assert count.datasyncs == 2 * rotations
    count.reset()
    log.sync()
    assert (count.datasyncs, count.dir_fsyncs) == (1, 1)
    count.reset()
    log.append(entries(61, 62, term=1))
    log.sync()
    assert (count.datasyncs, count.dir_fsyncs) == (1, 0)


def test_sync_in_a_worker_thread_while_the_owner_appends(tmp_path):
    log = DiskStorage(tmp_path, cluster_id=CLUSTER, segment_bytes=2000)
    stop = threading.Event()
    errors: list[BaseException] = []

    def syncer() -> None:
        while not stop.is_set():
            try:
                log.sync()
            except BaseException as exc:  # reported below, in the test's own thread
                errors.append(exc)
                return

    worker = threading.Thread(target=syncer)
    worker.start()
    try:
        for start in range(1, 2001, 20):
            log.append(entries(start, start + 20, term=1))
            if start % 200 == 1 and start > 1:
                log.append(entries(start + 10, start + 20, term=2))  # truncations too
    finally:
        stop.set()
        worker.join()
    assert errors == []
    log.sync()
    expected = log.entries(1, log.last_index() + 1)
    log.close()
    reopened = DiskStorage(tmp_path, cluster_id=CLUSTER, segment_bytes=2000)
    assert reopened.entries(1, reopened.last_index() + 1) == expected
    assert len(expected) == 2000
