"""`snapshot-at` for a user's state machine, end to end on a real moto_server: a real Counter
cluster (`flotilla.examples.counter:Counter`) archives; the job replays its archived snapshot and
segments through the Counter in one task (the sequential path), at a time between two phases of
commands and at the last index; the payloads are the node's own replay's, the totals are the
commands acknowledged by then, and a NEW Counter member restored from the job's output serves
that total."""

from __future__ import annotations

import time
import uuid

import pytest
from flotilla.pipeline.snapshot_at import prepare, snapshot_at
from flotilla.pipeline.source import ArchiveRef

from flotilla.client import Client
from tests.archive_node.support import FAST, REGION, post_snapshot, wait_archived
from tests.pipeline.archives import published_payload, replayed_payload

COUNTER = "flotilla.examples.counter:Counter"


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@pytest.mark.timeout(300)
def test_snapshot_at_replays_a_counter_cluster_s_archive(local_cluster, s3_store, spark):
    from flotilla.examples.counter import Counter

    old = local_cluster(1, extra_args=["--state-machine", COUNTER, *s3_store.archive_flags()],
                        env=s3_store.env, **FAST)
    old.wait_leader(30)
    url = old.nodes["n0"].url
    # Phase a: commands 0..19, a snapshot; phase b: 20..34 (then a time mark); phase c: 35..49.
    with Client(url, timeout=5.0) as c:
        for n in range(20):
            c.command(str(1 << n).encode())
        post_snapshot(old.nodes["n0"])
        for n in range(20, 35):
            c.command(str(1 << n).encode())
        mark = now_ms()
        time.sleep(0.03)  # phase c's entries are stamped strictly later
        for n in range(35, 50):
            c.command(str(1 << n).encode())
    last = old.status("n0")["commit_index"]
    wait_archived(old, "n0", last)
    old.stop_all()
    ref = ArchiveRef(s3_store.url, old.cluster_id, s3_store.endpoint, REGION)
    assert prepare(ref, last, machine=COUNTER).describe()["engine"] == "one sequential replay"

    def published(cluster_id: str) -> tuple[int, bytes]:
        """The index and payload (the Counter's total in hexadecimal) the job published."""
        meta, payload = published_payload(s3_store.url, cluster_id, s3_store.endpoint)
        return meta.index, payload

    at_mark = snapshot_at(spark, ref, time_ms=mark, machine=COUNTER,
                          to_cluster_id=f"{old.cluster_id}-b")
    index, payload = published(at_mark.cluster_id)
    assert int(payload, 16) == (1 << 35) - 1  # phases a and b, nothing of c
    assert payload == replayed_payload(s3_store.url, old.cluster_id, index, Counter,
                                       s3_store.endpoint)
    at_last = snapshot_at(spark, ref, last, machine=COUNTER)
    index, payload = published(at_last.cluster_id)
    assert index == last and int(payload, 16) == (1 << 50) - 1

    # The job's output restores into an unchanged Counter member.
    new = local_cluster(1, cluster_id=f"ctr-{uuid.uuid4().hex[:8]}", env=s3_store.env, **FAST,
                        extra_args=["--state-machine", COUNTER, "--restore-from", s3_store.url,
                                    *s3_store.endpoint_flags(), "--restore-cluster-id",
                                    at_mark.cluster_id])
    new.wait_leader(60)
    with Client(new.nodes["n0"].url, timeout=5.0) as c:
        assert c.query(None) == (1 << 35) - 1
