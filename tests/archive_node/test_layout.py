"""A cluster archiving to S3 (moto_server) writes exactly what docs/archive.md documents."""

from __future__ import annotations

import random
import re
import time

import pytest
from flotilla.node.archive import decode_segment
from flotilla.node.consensus import EntryKind
from flotilla.node.statemachine.kv import decode_command

from tests.archive_node.support import (
    FAST,
    Bucket,
    ConcurrentWriters,
    Store,
    Writer,
    archive_status,
    check_coverage,
    post_snapshot,
    random_writes,
    sha256,
    wait_archived,
    wait_for,
)

NAME = re.compile(r"^(snapshots/\d{20}-\d{20}\.snap|segments/\d{20}-\d{20}\.seg|"
                  r"manifests/\d{20}\.json)$")
#: A snapshot of a few kilobytes and its upload to moto_server take well under a second.
SNAPSHOT_ANSWER_S = 15.0


@pytest.mark.timeout(120)
def test_snapshots_segments_and_manifests_land_in_the_bucket(local_cluster, s3_store: Store,
                                                             bucket: Bucket):
    cluster = local_cluster(3, extra_args=s3_store.archive_flags(), env=s3_store.env, **FAST)
    cid = cluster.cluster_id
    leader = cluster.wait_leader()
    urls = [n.url for n in cluster.nodes.values()]
    keys = [f"layout/{i:02d}" for i in range(15)]
    rng = random.Random(1)

    with Writer(urls) as writer:
        random_writes(writer, keys, 40, rng, tag="a")
        first_batch = writer.writes[-1].index
        early = wait_archived(cluster, leader, first_batch)
        assert early["error"] is None, early
        assert early["url"] and early["url"].startswith(s3_store.url), early
        assert early["last_snapshot_index"] in (0, None), early

        snap = post_snapshot(cluster.nodes[leader])
        assert snap["index"] >= first_batch, snap
        assert snap["bytes"] > 0, snap
        snap_key = f"snapshots/{snap['index']:020d}-{snap['term']:020d}.snap"
        assert snap["location"] == f"{s3_store.url}/{cid}/{snap_key}", snap
        after_snap = archive_status(cluster, leader)
        assert after_snap["last_snapshot_index"] == snap["index"], after_snap
        assert after_snap["error"] is None, after_snap

        random_writes(writer, keys, 40, rng, tag="b")
        last = writer.writes[-1].index
        done = wait_archived(cluster, leader, last)
        writes = list(writer.writes)

    assert done["error"] is None, done
    assert done["last_snapshot_index"] == snap["index"], done
    assert done["last_archived_index"] > early["last_archived_index"], (early, done)

    # -- the objects: names, digests
    objects = bucket.keys(f"{cid}/")
    relative = [k[len(cid) + 1:] for k in objects]
    strays = [k for k in relative if not NAME.match(k)]
    assert not strays, f"objects outside the documented layout: {strays}"
    assert snap_key in relative, f"{snap_key} is not in the bucket: {relative}"
    assert any(k.startswith("segments/") for k in relative), relative
    bodies = {}
    for key in objects:
        body = bodies[key] = bucket.get(key)
        recorded = bucket.head(key)["Metadata"].get("sha256")
        assert recorded == sha256(body), f"{key}: x-amz-meta-sha256 {recorded!r} does not match"

    # -- the manifest in force references them
    manifest_name, manifest = bucket.manifest(cid)
    assert manifest["format"] == "flotilla-archive-manifest", manifest
    assert manifest["version"] == 1, manifest
    assert manifest["cluster_id"] == cid, manifest
    assert f"manifests/{manifest['seq']:020d}.json" == manifest_name[len(cid) + 1:], manifest
    assert isinstance(manifest["created"], str) and manifest["created"].endswith("Z"), manifest
    assert manifest["retention_floor"] == 0, manifest
    assert manifest["last_archived_index"] >= last, manifest
    assert archive_status(cluster, leader)["last_archived_index"] == \
        manifest["last_archived_index"], "status and the manifest in force disagree"

    [record] = [s for s in manifest["snapshots"] if s["index"] == snap["index"]]
    assert record["key"] == snap_key and record["term"] == snap["term"], record
    body = bodies[f"{cid}/{snap_key}"]
    assert record["bytes"] == len(body) == snap["bytes"], (record, len(body), snap)
    assert record["sha256"] == sha256(body), record
    local = (cluster.nodes[leader].data_dir / "snap" /
             f"snap-{snap['index']:016d}-{snap['term']:016d}.snap")
    assert local.exists(), f"the leader's snapshot file {local} is gone"
    assert local.read_bytes() == body, "the archived snapshot differs from the member's file"

    check_coverage(manifest, last)
    entries = {}
    for seg in manifest["segments"]:
        assert seg["key"] == f"segments/{seg['first']:020d}-{seg['last']:020d}.seg", seg
        data = bodies.get(f"{cid}/{seg['key']}")
        assert data is not None, f"the manifest references {seg['key']}, which is not there"
        assert seg["bytes"] == len(data) and seg["sha256"] == sha256(data), seg
        decoded = decode_segment(data, name=seg["key"], cluster_id=cid)
        assert [e.index for e in decoded] == list(range(seg["first"], seg["last"] + 1)), seg
        entries.update({e.index: e for e in decoded})
    assert min(entries) == 1, "the segments do not start at index 1 (no retention ran)"
    assert not [k for k in relative if k.startswith("segments/")
                and k not in {s["key"] for s in manifest["segments"]}], \
        "segments in the bucket that the manifest does not reference"

    # -- and every acknowledged write is in the archived log at its index
    for w in writes:
        entry = entries.get(w.index)
        assert entry is not None and entry.kind == EntryKind.NORMAL, (w, entry)
        cmd = decode_command(entry.data)
        assert (cmd.op, cmd.key) == ("put" if w.value is not None else "delete", w.key), (w, cmd)
        if w.value is not None:
            assert cmd.value == w.value, (w, cmd)


@pytest.mark.timeout(90)
def test_snapshot_is_shipped_while_writes_continue(local_cluster, s3_store: Store):
    """``POST /v1/snapshot`` during steady writes answers promptly with the archived location:
    shipping must not wait for the clients to pause."""
    cluster = local_cluster(1, extra_args=s3_store.archive_flags(), env=s3_store.env, **FAST)
    cluster.wait_leader()
    url = cluster.nodes["n0"].url
    writers = ConcurrentWriters([url], [f"steady/{i}" for i in range(10)], threads=2,
                                seed=5).start()
    try:
        wait_for(lambda: writers.count() >= 100, 30, "100 acknowledged writes")
        started = time.monotonic()
        try:
            snap = post_snapshot(cluster.nodes["n0"], timeout=SNAPSHOT_ANSWER_S)
        except TimeoutError:
            raise AssertionError(
                f"POST /v1/snapshot did not answer within {SNAPSHOT_ANSWER_S}s while "
                f"{writers.threads} clients kept writing ({writers.count()} writes so far); "
                f"archive status: {archive_status(cluster, 'n0')}\n"
                f"{cluster.nodes['n0'].log_tail(15)}") from None
        took = time.monotonic() - started
        status = archive_status(cluster, "n0")
    finally:
        writers.stop()
    writers.check()
    assert snap.get("location", "").endswith(
        f"/snapshots/{snap['index']:020d}-{snap['term']:020d}.snap"), snap
    assert status["last_snapshot_index"] == snap["index"], status
    print(f"POST /v1/snapshot under steady writes answered in {took:.2f}s")
