"""Rebuilding a lost cluster from its archive (``--restore-from``), to the newest archived state
or to exactly the state at an index (``--restore-index``)."""

from __future__ import annotations

import random
import shutil
import uuid

import pytest

from tests.archive_node.support import (
    FAST,
    ConcurrentWriters,
    Store,
    Writer,
    archive_status,
    assert_state,
    post_snapshot,
    random_writes,
    replay,
    state_from_segments,
    wait_archived,
    wait_for,
)


def kill_and_wipe(cluster) -> None:
    """The disaster: SIGKILL every member, then delete every data dir."""
    for node in cluster.nodes.values():
        node.kill()
    for node in cluster.nodes.values():
        shutil.rmtree(node.data_dir)
        assert not node.data_dir.exists()


@pytest.mark.timeout(150)
@pytest.mark.parametrize("store_name", ["s3", "file"])
def test_disaster_restore(local_cluster, request, store_name):
    store: Store = request.getfixturevalue(f"{store_name}_store")
    old = local_cluster(3, extra_args=store.archive_flags(), env=store.env, **FAST)
    old_id = old.cluster_id
    leader = old.wait_leader()
    keys = [f"dr/{i:03d}" for i in range(40)]

    urls = [n.url for n in old.nodes.values()]
    # Two bursts of concurrent writers with a snapshot between them, so the restore is a
    # snapshot plus segments.
    writes = []
    for burst, target in enumerate((60, 90)):
        writers = ConcurrentWriters(urls, keys, threads=3, delete_ratio=0.25,
                                    seed=burst).start()
        try:
            wait_for(lambda w=writers, t=target: w.count() >= t, 30,
                     f"{target} acknowledged writes")
        finally:
            writes += writers.stop()
        writers.check()
        if burst == 0:
            snap = post_snapshot(old.nodes[leader])
    writes.sort(key=lambda w: w.index)
    assert len({w.index for w in writes}) == len(writes), "two writes share an index"
    highest = writes[-1].index
    assert snap["index"] < highest, (snap, highest)
    archived = wait_archived(old, leader, highest)
    assert archived["error"] is None, archived
    assert archived["last_snapshot_index"] == snap["index"], archived
    expected = replay(writes)
    deleted = {w.key for w in writes} - set(expected)
    assert deleted, "the history deleted no key for good: the test proves less than it says"

    kill_and_wipe(old)
    old_manifest = store.manifest(old_id)
    assert old_manifest is not None and old_manifest.last_archived_index >= highest

    new_id = f"restored-{uuid.uuid4().hex[:8]}"
    new = local_cluster(3, cluster_id=new_id, env=store.env, **FAST,
                        extra_args=[*store.restore_flags(), *store.archive_flags()])
    new_leader = new.wait_leader(timeout=60)
    restored_at = old_manifest.last_archived_index
    for name in new.nodes:
        status = new.status(name)
        assert status["cluster_id"] == new_id, status
        assert status["snapshot"]["index"] == restored_at, (
            f"{name} did not start from the archived state at index {restored_at}: {status}")

    # Every acknowledged write is back, deleted keys stay deleted, nothing else exists.
    assert_state(new.nodes[new_leader].url, writes, None, keys, "dr/",
                 f"the cluster restored from {store.url}")

    # It takes new writes, after the restored index...
    with Writer([n.url for n in new.nodes.values()], name="after") as writer:
        random_writes(writer, [f"dr/new-{i}" for i in range(5)], 20, random.Random(3),
                      delete_ratio=0.0, tag="new")
        after = writer.writes
    assert after[0].index > restored_at, (after[0], restored_at)
    assert_state(new.nodes[new_leader].url, [*writes, *after], None,
                 [*keys, *(w.key for w in after)], "dr/", "the restored cluster after new writes")

    # ...and its leader archives them under its own cluster id, beside the old cluster.
    new_leader = new.wait_leader()
    shipped = wait_archived(new, new_leader, after[-1].index)
    assert shipped["error"] is None and shipped["url"].startswith(store.url), shipped
    new_manifest = store.manifest(new_id)
    assert new_manifest is not None, f"nothing archived under {store.url}/{new_id}"
    assert new_manifest.cluster_id == new_id
    assert new_manifest.last_archived_index >= after[-1].index, new_manifest
    # Its archive stands on its own: the restored state is its first snapshot there.
    assert any(lo <= restored_at and hi >= after[-1].index
               for lo, hi in new_manifest.restorable_ranges()), new_manifest
    untouched = store.manifest(old_id)
    assert untouched == old_manifest, "the restored cluster changed the old cluster's archive"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("where", ["before-first-snapshot", "after-newest-snapshot"])
def test_restore_at_index(local_cluster, s3_store: Store, where: str):
    old = local_cluster(1, extra_args=s3_store.archive_flags(), env=s3_store.env, **FAST)
    old_id = old.cluster_id
    url = old.nodes["n0"].url
    old.wait_leader()
    keys = [f"ri/{i:02d}" for i in range(12)]
    rng = random.Random(4)
    # One writer: a sequential history in which every write was acknowledged, with its index.
    # Snapshots are requested between the bursts, without waiting for the archive.
    with Writer([url]) as writer:
        random_writes(writer, keys, 30, rng, delete_ratio=0.3, tag="a")
        first_snap = post_snapshot(old.nodes["n0"])
        random_writes(writer, keys, 30, rng, delete_ratio=0.3, tag="b")
        second_snap = post_snapshot(old.nodes["n0"])
        random_writes(writer, keys, 30, rng, delete_ratio=0.3, tag="c")
        writes = list(writer.writes)
    indexes = [w.index for w in writes]
    assert indexes == sorted(indexes) and len(set(indexes)) == len(indexes), indexes
    wait_archived(old, "n0", writes[-1].index)
    assert archive_status(old, "n0")["last_snapshot_index"] == second_snap["index"]
    old.nodes["n0"].kill()
    manifest = s3_store.manifest(old_id)
    assert manifest is not None

    # In the first burst, or between the newest snapshot and the end.
    n = {"before-first-snapshot": writes[14].index,
         "after-newest-snapshot": writes[75].index}[where]
    assert first_snap["index"] < second_snap["index"] < writes[-1].index
    assert n < first_snap["index"] if where.startswith("before") else n > second_snap["index"]
    expected = replay(writes, n)
    assert expected != replay(writes), f"index {n} should not be the final state"

    # The archive can rebuild n: the documented ranges include it.
    ranges = manifest.restorable_ranges()
    assert any(lo <= n <= hi for lo, hi in ranges), (
        f"index {n} ({where}; snapshots at {first_snap['index']} and {second_snap['index']}, "
        f"last write {writes[-1].index}) is not restorable from the archive: restorable ranges "
        f"{ranges}; segments {[(s.first, s.last) for s in manifest.segments]}, snapshots "
        f"{[s.index for s in manifest.snapshots]}")

    # A new single-member cluster restored at exactly index n.
    restored = local_cluster(1, cluster_id=f"at-{n}-{uuid.uuid4().hex[:6]}", env=s3_store.env,
                             extra_args=s3_store.restore_flags(cluster_id=old_id, index=n),
                             **FAST)
    restored.wait_leader(timeout=60)
    assert restored.status("n0")["snapshot"]["index"] == n, restored.status("n0")
    assert_state(restored.nodes["n0"].url, writes, n, keys, "ri/",
                 f"restore at index {n} ({where})")

    # What the archive's segments alone say, decoded in this process from index 1 (no
    # retention ran: the archive holds the whole history), against the history.
    assert state_from_segments(s3_store, old_id, n) == expected, (
        f"the archived segments up to {n} disagree with the acknowledged writes")


@pytest.mark.timeout(60)
def test_restore_index_beyond_the_archive_is_refused(local_cluster, s3_store: Store):
    """An index the archive does not reach: exit code 4 (a target outside the archive), with a
    message naming it, and nothing written: the same data dir then restores an index there."""
    old = local_cluster(1, extra_args=s3_store.archive_flags(), env=s3_store.env, **FAST)
    old.wait_leader()
    with Writer([old.nodes["n0"].url]) as writer:
        random_writes(writer, ["x"], 5, random.Random(6), delete_ratio=0.0)
        writes = list(writer.writes)
    last = writes[-1].index
    wait_archived(old, "n0", last)
    old.nodes["n0"].kill()
    beyond = last + 1000
    refused = local_cluster(1, env=s3_store.env, **FAST,
                            extra_args=s3_store.restore_flags(cluster_id=old.cluster_id,
                                                              index=beyond))
    node = refused.nodes["n0"]
    assert node.wait(30) == 4, (
        f"--restore-index {beyond} beyond the archive: exit {node.returncode}\n"
        f"{node.log_tail(20)}")
    assert str(beyond) in node.log_tail(20), node.log_tail(20)
    assert sorted(p.name for p in node.data_dir.iterdir()) == ["flotilla.lock"]

    node.extra_args = s3_store.restore_flags(cluster_id=old.cluster_id, index=last)
    node.restart()
    refused.wait_leader(timeout=30)
    assert refused.status("n0")["snapshot"]["index"] == last
    assert_state(node.url, writes, last, ["x"], "", "the same data dir restored at its index")
