"""Every entry carries the wall-clock time at which its leader appended it (docs/contract.md), read
back from the archive of a real 3-member cluster: client writes are stamped within the time the
test spent writing them, times never decrease along the log (across a leadership transfer too),
and the manifest's time ranges and snapshot times agree with the entries."""

from __future__ import annotations

import time

import pytest
from flotilla.node.consensus import EntryKind
from flotilla.node.storage import PayloadReader

from tests.archive_node.support import (
    FAST,
    Store,
    Writer,
    post_snapshot,
    wait_archived,
    wait_for,
)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def transfer_leadership(cluster, leader: str) -> str:
    target = next(name for name in cluster.nodes if name != leader)
    with cluster.client(leader, timeout=10) as client:
        resp = client.post_json("/v1/leader", {"name": target})
    assert resp.status == 200, resp
    wait_for(lambda: cluster.wait_leader() == target, 20, f"{target} to lead")
    return target


@pytest.mark.timeout(180)
def test_a_real_cluster_stamps_every_entry_with_its_leaders_clock(local_cluster, file_store,
                                                                    tmp_path):
    store: Store = file_store
    cluster = local_cluster(3, extra_args=store.archive_flags(segment_entries=16), **FAST)
    leader = cluster.wait_leader()
    urls = [n.url for n in cluster.nodes.values()]
    windows: dict[int, tuple[int, int]] = {}  # index -> (ms before the request, ms after)
    with Writer(urls) as writer:
        for burst in range(3):
            for n in range(20):
                before = now_ms()
                write = writer.put(f"t/{burst}-{n:02d}", f"value {burst} {n}")
                windows[write.index] = (before, now_ms())
            if burst == 0:
                snapshot = post_snapshot(cluster.nodes[leader])
            if burst == 1:
                leader = transfer_leadership(cluster, leader)
    highest = max(windows)
    wait_archived(cluster, cluster.wait_leader(), highest, timeout=60)

    archive = store.cluster_archive(cluster.cluster_id)
    try:
        manifest = archive.manifest()
        log = [e for segment in manifest.segments for e in archive.read_segment(segment)]
    finally:
        archive.archive.close()
    assert [e.index for e in log] == list(range(1, len(log) + 1)), "segments overlap or gap"
    times = [e.ts_ms for e in log]
    assert times == sorted(times), "times decrease along the log"
    assert all(t > 0 for t in times), "an entry without a time"
    for entry in log:
        if entry.index in windows:
            low, high = windows[entry.index]
            assert entry.kind == EntryKind.NORMAL
            assert low <= entry.ts_ms <= high, (entry.index, low, entry.ts_ms, high)
    assert sum(e.kind == EntryKind.NOOP for e in log) >= 2, "no leader change was archived"
    by_index = {e.index: e for e in log}
    for segment in manifest.segments:
        assert (segment.first_ts_ms, segment.last_ts_ms) == (
            by_index[segment.first].ts_ms, by_index[segment.last].ts_ms), segment
    archived_snapshot = next(s for s in manifest.snapshots if s.index == snapshot["index"])
    assert archived_snapshot.ts_ms == by_index[snapshot["index"]].ts_ms

    # A new cluster restored at an index starts from that index's time.
    at = snapshot["index"] + 7
    restored = local_cluster(1, cluster_id="restored-time", **FAST,
                             extra_args=store.restore_flags(cluster_id=cluster.cluster_id,
                                                            index=at))
    restored.wait_leader(timeout=60)
    snap_dir = restored.nodes["n0"].data_dir / "snap"
    (path,) = snap_dir.glob("*.snap")
    with PayloadReader(path) as reader:
        assert (reader.meta.index, reader.meta.ts_ms) == (at, by_index[at].ts_ms)
