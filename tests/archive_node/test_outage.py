"""S3 unreachable for a while: clients never notice, the archive reports the error, and once
the store answers again the archive catches up with no gap and no overlap."""

from __future__ import annotations

import time
from urllib.parse import urlsplit

import pytest

from tests.archive_node.support import (
    FAST,
    Bucket,
    ConcurrentWriters,
    Store,
    archive_status,
    check_coverage,
    wait_archived,
    wait_for,
)
from tests.harness.faultproxy import FaultProxy

OUTAGE_S = 10.0
#: A write that takes longer than this while only the archive is down is a regression: the
#: archive must never sit in the write path.
WRITE_LATENCY_BOUND_S = 2.0
#: After the heal: time for the archiver to notice the store is back and ship the backlog.
CATCH_UP_S = 30.0


@pytest.mark.timeout(150)
@pytest.mark.parametrize("mode", ["blackhole", "refused"])
def test_archive_outage_is_invisible_to_clients(local_cluster, moto_s3, s3_store: Store,
                                                bucket: Bucket, mode: str):
    """``blackhole``: the path to S3 silently drops everything (a network partition; the
    proxy accepts connections and nothing comes back). ``refused``: the endpoint is down (open
    connections are reset, new ones refused)."""
    moto = urlsplit(moto_s3.endpoint)
    with FaultProxy((moto.hostname, moto.port), name="s3-proxy").start() as proxy:
        store = Store(s3_store.url, proxy.url, s3_store.env)
        cluster = local_cluster(3, extra_args=store.archive_flags(), env=store.env, **FAST)
        cid = cluster.cluster_id
        leader = cluster.wait_leader()
        writers = ConcurrentWriters([n.url for n in cluster.nodes.values()],
                                    [f"out/{i:02d}" for i in range(20)], threads=2,
                                    think=0.005, seed=7).start()
        during: list[dict] = []
        try:
            wait_for(lambda: writers.count() >= 50, 30, "50 acknowledged writes")
            healthy = wait_archived(cluster, leader, 20)
            assert healthy["error"] is None, healthy
            before_block = writers.count()

            if mode == "blackhole":
                proxy.block()
            else:
                proxy.block(refuse_new=True)
                proxy.reset()
            blocked_at = time.monotonic()
            while time.monotonic() - blocked_at < OUTAGE_S:
                doc = archive_status(cluster, leader)
                during.append({**doc, "t": round(time.monotonic() - blocked_at, 1)})
                time.sleep(0.25)
            written_while_blocked = writers.count() - before_block
            proxy.heal()
            healed_at = time.monotonic()

            wait_for(lambda: writers.count() >= before_block + written_while_blocked + 50, 30,
                     "50 more writes after the heal")
        finally:
            writes = writers.stop()
        writers.check()  # every write was acknowledged, none failed

        assert written_while_blocked > 0, "no write was acknowledged during the outage"
        slowest = max(writes, key=lambda w: w.latency)
        assert slowest.latency < WRITE_LATENCY_BOUND_S, (
            f"a write took {slowest.latency:.2f}s while only the archive was down: {slowest}")

        # Both of these are checked, and reported together when they fail.
        problems = []
        errors = [d for d in during if d.get("error")]
        if not errors:
            problems.append(
                f"the leader's /v1/status never showed an archive error during the {OUTAGE_S}s "
                f"outage; (seconds into the outage, last_archived_index, error): "
                f"{[(d['t'], d['last_archived_index'], d['error']) for d in during]}")
        commit = cluster.status(leader)["commit_index"]
        assert commit >= writes[-1].index
        try:
            caught_up = wait_archived(cluster, leader, commit, timeout=CATCH_UP_S)
        except AssertionError:
            caught_up = None
            problems.append(
                f"the archive did not catch up with commit index {commit} within {CATCH_UP_S}s "
                f"of the heal: status {archive_status(cluster, leader)}")
        took = time.monotonic() - healed_at
        first_error = (f"after {errors[0]['t']}s: {errors[0]['error'][:150]}" if errors
                       else "never")
        print(f"outage ({mode}): {written_while_blocked} writes while blocked, slowest write "
              f"{slowest.latency:.3f}s, first archive error {first_error}, caught up "
              f"{f'{took:.1f}s after the heal' if caught_up else 'NOT'}")
        assert not problems, "\n".join(problems) + "\n" + cluster.nodes[leader].log_tail(20)
        wait_for(lambda: archive_status(cluster, leader)["error"] is None, 10,
                 "the archive error to clear")

    _, manifest = bucket.manifest(cid)
    assert manifest["last_archived_index"] >= commit, manifest
    check_coverage(manifest, commit)
    referenced = {s["key"] for s in manifest["segments"]}
    present = set(bucket.keys(f"{cid}/segments/"))
    missing = {k for k in referenced if f"{cid}/{k}" not in present}
    assert not missing, f"the manifest references segments that are not there: {missing}"
