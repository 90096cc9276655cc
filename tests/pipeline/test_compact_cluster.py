"""Compaction of a live cluster's archive, end to end on moto_server: a real 3-node cluster
archives while a pass runs (the pass and the archiving leader publish manifests concurrently),
then a new learner catches up through the compacted archive, and after losing every member a
new cluster restored from it holds exactly the acknowledged writes."""

from __future__ import annotations

import shutil
import uuid

import pytest
from flotilla.pipeline.compact import CompactionPolicy, CompactionResult, compact
from flotilla.pipeline.source import ArchiveRef

from tests.archive_node.support import (
    FAST,
    REGION,
    ConcurrentWriters,
    Store,
    assert_state,
    post_snapshot,
    wait_archived,
    wait_for,
)


@pytest.mark.timeout(240)
def test_a_live_clusters_archive_is_compacted_while_it_archives_and_restores_exactly(
        spark, local_cluster, s3_store: Store):
    store = s3_store
    cluster = local_cluster(3, env=store.env, **FAST,
                            extra_args=store.archive_flags(segment_entries=25))
    leader = cluster.wait_leader()
    urls = [n.url for n in cluster.nodes.values()]
    keys = [f"cc/{i:02d}" for i in range(24)]
    writes = []
    writers = ConcurrentWriters(urls, keys, threads=3, delete_ratio=0.3, seed=1).start()
    try:
        wait_for(lambda: writers.count() >= 150, 60, "150 acknowledged writes")
        post_snapshot(cluster.nodes[leader])
        wait_for(lambda: writers.count() >= 250, 60, "250 acknowledged writes")
        archived = wait_archived(cluster, leader, max(w.index for w in writers.writes))
        assert archived["error"] is None, archived
        # The pass runs while the writers go on and the leader keeps publishing.
        ref = ArchiveRef(store.url, cluster.cluster_id, store.endpoint, REGION)
        result = compact(spark, ref, CompactionPolicy(min_dirty_ratio=0.01))
        wait_for(lambda: writers.count() >= 330, 60, "330 acknowledged writes")
    finally:
        writes += writers.stop()
    writers.check()
    assert isinstance(result, CompactionResult), result
    assert result.entries_after < result.entries_before

    writes.sort(key=lambda w: w.index)
    highest = writes[-1].index
    leader = cluster.wait_leader()
    archived = wait_archived(cluster, leader, highest)
    assert archived["error"] is None, archived
    manifest = store.manifest(cluster.cluster_id)
    assert manifest.cleaned_through == result.cleaned_through > 0
    assert manifest.restorable_ranges()[-1] == (result.cleaned_through,
                                                manifest.last_archived_index)
    assert manifest.last_archived_index >= highest
    assert any(s.first > result.cleaned_through for s in manifest.raw_segments)

    # A new learner catches up (through the archive's snapshot, then the leader's log).
    learner = cluster.add_member("n3")
    wait_for(lambda: cluster.status("n3")["applied_index"] >= highest, 60,
             "the learner to catch up")
    assert_state(learner.url, writes, None, keys, "cc/", "the learner")

    # Every member lost: a new cluster restored from the compacted archive.
    for node in cluster.nodes.values():
        node.kill()
    for node in cluster.nodes.values():
        shutil.rmtree(node.data_dir)
    new = local_cluster(3, cluster_id=f"back-{uuid.uuid4().hex[:8]}", env=store.env, **FAST,
                        extra_args=store.restore_flags(cluster_id=cluster.cluster_id))
    new_leader = new.wait_leader(timeout=60)
    assert_state(new.nodes[new_leader].url, writes, None, keys, "cc/",
                 "the cluster restored from the compacted archive")
