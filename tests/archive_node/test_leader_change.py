"""A new leader resumes archiving from the manifest: after the archiving leader is killed,
the archive goes on from where it stopped, with no gap, no overlap and every acknowledged
write in it."""

from __future__ import annotations

import json

import pytest

from tests.archive_node.support import (
    ConcurrentWriters,
    Store,
    check_coverage,
    replay,
    state_from_segments,
    wait_archived,
)
from tests.harness.polling import wait_for

FAST = {"election_timeout_ms": 500, "heartbeat_ms": 50}


@pytest.mark.timeout(120)
def test_a_new_leader_resumes_from_the_manifest(local_cluster, file_store: Store):
    cluster = local_cluster(3, extra_args=file_store.archive_flags(), **FAST)
    first = cluster.wait_leader()
    keys = [f"lc/{i:02d}" for i in range(20)]
    urls = [n.url for n in cluster.nodes.values()]
    writes = []
    for burst, target in enumerate((40, 80)):
        writers = ConcurrentWriters(urls, keys, threads=2, delete_ratio=0.2, seed=burst).start()
        try:
            wait_for(lambda w=writers, t=target: w.count() >= t, 30, f"{target} writes")
        finally:
            writes += writers.stop()
        writers.check()
        if burst == 0:
            before = wait_archived(cluster, first, max(w.index for w in writes))
            cluster.nodes[first].kill()
            urls = [cluster.nodes[m].url for m in cluster.members if m != first]
    second = cluster.wait_leader(among=[m for m in cluster.members if m != first])
    highest = max(w.index for w in writes)
    after = wait_archived(cluster, second, highest)
    assert after["error"] is None, after
    assert after["last_archived_index"] > before["last_archived_index"]

    manifest = file_store.manifest(cluster.cluster_id)
    check_coverage(json.loads(manifest.to_json()), highest)
    assert state_from_segments(file_store, cluster.cluster_id, highest) == replay(writes), (
        "the archive does not hold exactly the acknowledged writes")
