"""Point-in-time restore end to end, on a real moto_server: a real 3-member cluster writes in
phases at known times and archives; `snapshot-at` (real Spark) synthesizes the state at an
index and at times; NEW clusters restored from its output hold exactly the acknowledged state
at that point, checked against the client's own record of its writes (never against the
product's output); a time outside the archive exits 4 naming the range; and a member started
with `--restore-time` lands on the same index as the job, holding the same state."""

from __future__ import annotations

import random
import time
import uuid

import pytest
from flotilla.node.archive import format_ms, parse_time
from flotilla.pipeline.snapshot_at import snapshot_at
from flotilla.pipeline.source import ArchiveRef

from tests.archive_node.support import (
    FAST,
    REGION,
    Store,
    Writer,
    assert_state,
    post_snapshot,
    random_writes,
    wait_archived,
)
from tests.harness.cli import flotilla

KEYS = [f"pit/{i:02d}" for i in range(15)]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def restore_one(local_cluster, store: Store, *flags: str):
    """A NEW one-member cluster restored from `store` with `flags`; its member's URL and the
    index it starts from."""
    new = local_cluster(1, cluster_id=f"pit-{uuid.uuid4().hex[:8]}", env=store.env, **FAST,
                        extra_args=["--restore-from", store.url, *store.endpoint_flags(),
                                    *flags])
    new.wait_leader(timeout=60)
    return new.nodes["n0"].url, new.status("n0")["snapshot"]["index"]


@pytest.mark.timeout(420)
def test_a_cluster_comes_back_as_it_was_at_an_index_and_at_a_time(local_cluster, s3_store,
                                                                   spark):
    old = local_cluster(3, extra_args=s3_store.archive_flags(), env=s3_store.env, **FAST)
    old_id = old.cluster_id
    old.wait_leader()
    rng = random.Random(12)
    # Four phases of 40 acknowledged writes; after each, the time (taken after its last
    # acknowledgement and before the next phase's first request) and the writes so far. A
    # snapshot after phase b makes later targets a snapshot plus segments.
    boundaries: list[tuple[int, int]] = []
    with Writer([n.url for n in old.nodes.values()]) as writer:
        for phase in "abcd":
            random_writes(writer, KEYS, 40, rng, delete_ratio=0.3, tag=phase)
            boundaries.append((now_ms(), len(writer.writes)))
            time.sleep(0.03)  # the next phase's entries are stamped strictly later
            if phase == "b":
                post_snapshot(old.nodes[old.wait_leader()])
        writes = list(writer.writes)
    assert [w.index for w in writes] == sorted({w.index for w in writes})
    archived = wait_archived(old, old.wait_leader(), writes[-1].index)
    assert archived["error"] is None and archived["last_snapshot_index"], archived
    old.stop_all()
    ref = ArchiveRef(s3_store.url, old_id, s3_store.endpoint, REGION)

    def last_index(count: int) -> int:
        return writes[count - 1].index

    # At a time: the boundary after phase a, and after phase c (past the snapshot).
    by_time = {}
    for phase, (at_ms, count) in zip("ac", (boundaries[0], boundaries[2]), strict=True):
        result = by_time[phase] = snapshot_at(spark, ref, time_ms=at_ms,
                                              to_cluster_id=f"{old_id}-{phase}")
        # Everything acknowledged by then, nothing of the next phase.
        assert last_index(count) <= result.index < writes[count].index, (phase, result)
        url, index = restore_one(local_cluster, s3_store, "--restore-cluster-id",
                                 result.cluster_id)
        assert index == result.index
        assert_state(url, writes, last_index(count), KEYS, "pit/",
                     f"restored from snapshot-at --time {format_ms(at_ms)} (after phase {phase})")

    # At an index in the middle of phase d: the result carries that entry's own time.
    middle = writes[boundaries[2][1] + 17]
    by_index = snapshot_at(spark, ref, middle.index)
    assert by_index.cluster_id == f"{old_id}-at-{middle.index}"
    url, index = restore_one(local_cluster, s3_store, "--restore-cluster-id",
                             by_index.cluster_id)
    assert index == middle.index
    assert_state(url, writes, middle.index, KEYS, "pit/", f"snapshot-at --index {middle.index}")
    assert boundaries[2][0] < parse_time(by_index.time) <= boundaries[3][0]

    # A time after the last archived entry: exit 4 and the range, before Spark starts.
    late = format_ms(boundaries[-1][0] + 3_600_000)
    outside = flotilla("pipeline", "snapshot-at", "--archive", s3_store.url,
                       *s3_store.endpoint_flags(), "--cluster-id", old_id, "--time", late,
                       text=True,
                       env=dict(s3_store.env))
    assert outside.returncode == 4, outside.stderr
    assert f"{late} cannot be restored from {s3_store.url}" in outside.stderr
    assert "after the last archived entry; restorable times are" in outside.stderr

    # The node's own --restore-time agrees with the job (one time resolution, one log).
    at_ms, count = boundaries[0]
    url, index = restore_one(local_cluster, s3_store, "--restore-cluster-id", old_id,
                             "--restore-time", format_ms(at_ms))
    assert index == by_time["a"].index
    assert_state(url, writes, last_index(count), KEYS, "pit/",
                 f"flotilla node --restore-time {format_ms(at_ms)}")
