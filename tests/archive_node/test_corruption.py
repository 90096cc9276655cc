"""Damaged archive objects at restore time: a corrupt newest snapshot is refused with a clear
message and the restore falls back to an older snapshot plus more segments; when no intact way
remains, the member exits with code 3 naming the object."""

from __future__ import annotations

import random
import time
import uuid

import pytest

from tests.archive_node.support import (
    FAST,
    Bucket,
    Store,
    Writer,
    assert_state,
    corrupt,
    post_snapshot,
    random_writes,
    sha256,
    wait_archived,
    wait_for,
)


@pytest.mark.timeout(120)
def test_corrupt_objects_at_restore(local_cluster, s3_store: Store, bucket: Bucket):
    old = local_cluster(1, extra_args=s3_store.archive_flags(), env=s3_store.env, **FAST)
    old_id = old.cluster_id
    url = old.nodes["n0"].url
    old.wait_leader()
    keys = [f"cr/{i:02d}" for i in range(12)]
    rng = random.Random(8)
    with Writer([url]) as writer:
        for burst in ("a", "b", "c"):
            random_writes(writer, keys, 25, rng, delete_ratio=0.25, tag=burst)
            if burst != "c":
                # Let the archive take the burst first, so that the older snapshot plus the
                # segments after it make a complete way to the newest state.
                wait_archived(old, "n0", writer.writes[-1].index)
                post_snapshot(old.nodes["n0"])
        writes = list(writer.writes)
    wait_archived(old, "n0", writes[-1].index)
    old.nodes["n0"].kill()

    _, manifest = bucket.manifest(old_id)
    newest_index = manifest["last_archived_index"]
    assert newest_index >= writes[-1].index, manifest
    assert len(manifest["snapshots"]) == 2, manifest
    older, newest = manifest["snapshots"]

    # Bit rot in the newest snapshot: different bytes, still claiming the original digest.
    newest_key = f"{old_id}/{newest['key']}"
    original = bucket.get(newest_key)
    bucket.put(newest_key, corrupt(original), metadata={"sha256": sha256(original)})

    fallback = local_cluster(1, cluster_id=f"fb-{uuid.uuid4().hex[:8]}", env=s3_store.env,
                             extra_args=s3_store.restore_flags(), **FAST)
    fallback.wait_leader(timeout=60)
    node = fallback.nodes["n0"]
    assert fallback.status("n0")["snapshot"]["index"] == newest_index, fallback.status("n0")
    assert_state(node.url, writes, None, keys, "cr/",
                 "the cluster restored past a corrupt newest snapshot")
    log = node.log_tail(200)
    refusal = [line for line in log.splitlines()
               if newest["key"] in line and "WARNING" in line]
    assert refusal, f"no WARNING names the corrupt {newest['key']}:\n{log}"
    assert any(word in refusal[0].lower() for word in ("sha-256", "sha256", "digest",
                                                       "checksum", "corrupt")), refusal[0]
    assert older["key"] in log, f"the log does not say it used {older['key']} instead:\n{log}"
    fallback.stop_all()

    # Now also damage the segment that holds the newest index: every plan needs it.
    [last_segment] = [s for s in manifest["segments"] if s["last"] == newest_index]
    segment_key = f"{old_id}/{last_segment['key']}"
    bucket.put(segment_key, corrupt(bucket.get(segment_key)))  # as another tool would

    refused = local_cluster(1, cluster_id=f"no-{uuid.uuid4().hex[:8]}", env=s3_store.env,
                            extra_args=s3_store.restore_flags(), **FAST)
    node = refused.nodes["n0"]
    started = time.monotonic()
    wait_for(lambda: not node.running, 60, "the member to give up on the damaged archive")
    log = node.log_tail(40)
    assert node.returncode == 3, f"exit code {node.returncode} (after " \
        f"{time.monotonic() - started:.1f}s), expected 3:\n{log}"
    last_line = [line for line in log.splitlines() if line.strip()][-1]
    assert last_segment["key"] in last_line, (
        f"the exit message does not name {last_segment['key']}: {last_line}")
