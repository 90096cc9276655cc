"""A new learner behind a compacted leader log catches up through the archive when there is
one (the leader sends a reference, not the snapshot) and through the leader when there is not.
Real processes on loopback, with a file:// archive."""

from __future__ import annotations

import time
import urllib.request

import pytest

from tests.harness.fixtures import local_cluster  # noqa: F401 (a fixture)
from tests.harness.polling import wait_for

FAST = {"election_timeout_ms": 500, "heartbeat_ms": 50}


def metrics(node) -> dict[str, float]:
    text = urllib.request.urlopen(node.url + "/metrics", timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def caught_up(cluster, name: str, leader: str, timeout: float = 30.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        target = cluster.status(leader)["commit_index"]
        applied = cluster.status(name)["applied_index"]
        if applied >= target:
            return applied
        time.sleep(0.05)
    raise AssertionError(f"{name} did not catch up with {leader} in {timeout}s")


@pytest.mark.parametrize("archive", [True, False], ids=["through-archive", "through-leader"])
def test_a_new_learner_catches_up_behind_a_compacted_log(local_cluster, tmp_path,  # noqa: F811
                                                         archive):
    extra = ["--archive", (tmp_path / "archive").as_uri(), "--archive-interval-ms", "200"] \
        if archive else []
    cluster = local_cluster(3, extra_args=extra, **FAST)
    leader = cluster.wait_leader(20)
    with cluster.client(leader) as c:
        for i in range(200):
            assert c.put(f"k{i:03d}", b"v" * 200).status == 200
        snap = c.request("POST", "/v1/snapshot", b"")
        assert snap.status == 200, snap.body
        location = snap.json()["location"]
        assert ("/archive/" in location) == archive, location
        for i in range(20):
            assert c.put(f"tail{i}", b"t").status == 200
        first = c.status()["first_index"]
    assert first > 1, "the snapshot did not compact the leader's log"
    before = metrics(cluster.nodes[leader])

    learner = cluster.add_member("n3")
    caught_up(cluster, "n3", leader)

    # The leader's view of the learner: how far behind its log it is, down to nothing.
    after = wait_for(lambda: (m := metrics(cluster.nodes[leader]))[
        'flotilla_server_learner_lag_entries{learner="n3"}'] == 0 and m, 10,
        "the leader to see the learner's lag reach 0")
    assert after["flotilla_server_learners"] == 1
    mine = metrics(learner)
    streamed = after["flotilla_snapshots_sent_total"] - before["flotilla_snapshots_sent_total"]
    referred = (after["flotilla_snapshot_references_sent_total"]
                - before["flotilla_snapshot_references_sent_total"])
    via_archive = mine['flotilla_snapshots_installed_total{source="archive"}']
    via_leader = mine['flotilla_snapshots_installed_total{source="leader"}']
    if archive:
        assert (via_archive, via_leader, streamed, referred) == (1, 0, 0, 1)
        assert after['flotilla_archive_uploads_total{kind="snapshot"}'] >= 1
        assert after["flotilla_archive_last_snapshot_index"] >= first - 1
        assert after["flotilla_archive_errors_total"] == 0
        assert after["flotilla_snapshot_bytes_sent_total"] == before[
            "flotilla_snapshot_bytes_sent_total"]
    else:
        assert (via_archive, via_leader, streamed, referred) == (0, 1, 1, 0)
        assert "flotilla_archive_last_archived_index" not in after
    with learner.client() as c:
        got = c.get("k123", consistency="serializable")
        assert (got.status, got.body) == (200, b"v" * 200)
        assert c.get("tail19", consistency="serializable").body == b"t"


def test_a_learner_that_cannot_reach_the_archive_is_streamed_the_snapshot(
        local_cluster, tmp_path):  # noqa: F811
    """The leader refers the learner to the archive; the learner has no --archive, answers
    409, and the leader streams the snapshot instead."""
    cluster = local_cluster(3, extra_args=["--archive", (tmp_path / "archive").as_uri()],
                            **FAST)
    leader = cluster.wait_leader(20)
    with cluster.client(leader) as c:
        for i in range(50):
            assert c.put(f"k{i}", b"v").status == 200
        snap = c.request("POST", "/v1/snapshot", b"")
        assert "/archive/" in snap.json()["location"], snap.body
    before = metrics(cluster.nodes[leader])
    cluster.extra_args = []  # the learner alone starts without an archive
    learner = cluster.add_member("n3")
    caught_up(cluster, "n3", leader)
    after = metrics(cluster.nodes[leader])
    mine = metrics(learner)
    assert after["flotilla_snapshots_sent_total"] - before["flotilla_snapshots_sent_total"] == 1
    assert (after["flotilla_snapshot_references_sent_total"]
            == before["flotilla_snapshot_references_sent_total"])
    assert mine['flotilla_snapshots_installed_total{source="leader"}'] == 1
    assert "could not fetch snapshot" in cluster.nodes[leader].log_tail(200)
