"""A member's `/metrics` and logs, on real processes.

One three-member cluster with TLS, an archive and JSON logs tells the story: every member's
`/metrics` passes `promtool check metrics` and has the families of the contract; every member
counts the leader; the leader measures its round trips to both followers. The leader is killed:
the others see a new one (leader changes counted). Its last follower is killed: the member
left alone stops counting a leader within about two election timeouts. Every line each member
logged is one JSON object. A member run with `--log-level warning` logs no info line.
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from typing import Any

from flotilla.node.tls import expires
from prometheus_client.parser import text_string_to_metric_families

from tests.harness.polling import wait_for
from tests.harness.processes import LocalCluster
from tests.harness.promtool import check_metrics
from tests.node.one_member import one_member, serving

ELECTION_MS = 500
FAST = {"election_timeout_ms": ELECTION_MS, "heartbeat_ms": 50}
KEY = "metrics-secret-key"  # a key must never become a label value

#: The sample names the contract and the agreed families promise on every member.
AGREED = {
    "flotilla_server_has_leader", "flotilla_server_is_leader",
    "flotilla_server_leader_changes_seen_total", "flotilla_server_proposals_committed_total",
    "flotilla_server_proposals_applied_total", "flotilla_server_proposals_failed_total",
    "flotilla_server_proposals_pending", "flotilla_disk_wal_fsync_duration_seconds_bucket",
    "flotilla_server_apply_duration_seconds_bucket",
    "flotilla_network_peer_round_trip_time_seconds_bucket",
    "flotilla_http_request_duration_seconds_bucket", "flotilla_build_info",
    "flotilla_server_voters", "flotilla_server_learners",
    "flotilla_tls_certificate_expiry_timestamp_seconds", "flotilla_archive_errors_total",
    "flotilla_archive_last_archived_index", "flotilla_snapshots_sent_total",
    "flotilla_snapshots_installed_total", "process_cpu_seconds_total",
    "process_resident_memory_bytes", "process_open_fds", "python_info",
    "python_gc_objects_collected_total",
    # the families docs/metrics.md listed before these
    "flotilla_term", "flotilla_is_leader", "flotilla_role", "flotilla_commit_index",
    "flotilla_applied_index", "flotilla_proposals_total", "flotilla_proposals_refused_total",
    "flotilla_log_appended_entries_total", "flotilla_fsync_seconds_bucket",
    "flotilla_append_seconds_bucket", "flotilla_append_batch_entries_bucket",
    "flotilla_disk_free_bytes", "flotilla_alarm_nospace", "flotilla_snapshots_taken_total",
    "flotilla_snapshot_bytes_sent_total", "flotilla_snapshot_references_sent_total",
    "flotilla_peer_stream_dials_total", "flotilla_peer_acks_beyond_sent_total",
    "flotilla_peer_sender_restarts_total", "flotilla_archive_last_snapshot_index",
    "flotilla_archive_uploads_total",
}
ROUTES = {"/v1/kv/{key}", "/v1/status", "/metrics", "unmatched"}


def scrape(cluster: LocalCluster, name: str) -> bytes:
    with cluster.client(name, timeout=5) as c:
        resp = c.request("GET", "/metrics")
    assert resp.status == 200 and resp.headers.get("Content-Type", "").startswith(
        "text/plain; version=0.0.4"), resp
    return resp.body


def samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(sample name, sorted labels): value} of an exposition."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text.decode())
            for s in family.samples}


def value(found: dict, name: str, **labels: str) -> float:
    return found[(name, tuple(sorted(labels.items())))]


def series(found: dict, name: str) -> list[dict[str, str]]:
    return [dict(labels) for sample, labels in found if sample == name]


def test_members_export_etcds_families_and_stop_counting_a_leader_after_losing_quorum(
        local_cluster, tmp_path):
    archive = tmp_path / "archive"
    archive.mkdir()
    cluster = local_cluster(3, tls=True, **FAST, extra_args=[
        "--log-format", "json", "--archive", archive.as_uri()])
    leader = cluster.wait_leader(30)
    follower = next(n for n in cluster.nodes if n != leader)
    for name in (leader, follower):  # a follower's write is forwarded to the leader
        with cluster.client(name, timeout=10) as c:
            for i in range(3):
                c.put(f"{KEY}-{name}-{i}", b"v")

    def measured(name: str) -> dict | None:
        """The member's samples once it has timed a round trip to each peer it sends to."""
        found = samples(scrape(cluster, name))
        peers = set(cluster.nodes) - {name} if name == leader else {leader}
        timed = {labels["To"] for labels in
                 series(found, "flotilla_network_peer_round_trip_time_seconds_count")
                 if value(found, "flotilla_network_peer_round_trip_time_seconds_count",
                          **labels) > 0}
        return found if peers <= timed else None

    commit = cluster.status(leader)["commit_index"]
    for name, node in cluster.nodes.items():
        found = wait_for(lambda n=name: measured(n), 10, f"{name} to time its peers")
        check_metrics(scrape(cluster, name), f"{name}'s /metrics")
        names = {sample for sample, _ in found}
        assert names >= AGREED, sorted(AGREED - names)
        assert value(found, "flotilla_server_has_leader") == 1
        assert value(found, "flotilla_server_is_leader") == int(name == leader)
        assert value(found, "flotilla_server_voters") == 3
        assert value(found, "flotilla_server_learners") == 0
        assert value(found, "flotilla_server_proposals_committed_total") >= commit >= 7
        assert value(found, "flotilla_server_leader_changes_seen_total") >= 1
        # the buckets reach etcd's 8.192 s, so "fsync p99 above 1 s" can fire
        assert value(found, "flotilla_disk_wal_fsync_duration_seconds_bucket", le="8.192") > 0
        assert value(found, "flotilla_server_apply_duration_seconds_bucket", le="+Inf") > 0
        not_after = expires(node.tls.cert_file.read_bytes()).timestamp()
        for usage in ("client", "peer"):
            assert value(found, "flotilla_tls_certificate_expiry_timestamp_seconds",
                         usage=usage) == not_after
        requests = series(found, "flotilla_http_request_duration_seconds_count")
        assert {r["route"] for r in requests} <= ROUTES, requests
        assert not any(KEY in v for r in requests for v in r.values())
        # archive lag: the member that ships (the leader) says how far the archive trails
        lag = series(found, "flotilla_archive_lag_entries")
        assert lag == ([{}] if name == leader else []), lag
    writes = samples(scrape(cluster, leader))
    assert value(writes, "flotilla_http_request_duration_seconds_count", method="PUT",
                 route="/v1/kv/{key}", code="200") >= 3

    # The leader dies: the others elect another, and count the change.
    survivors = [n for n in cluster.nodes if n != leader]
    changes = {n: value(samples(scrape(cluster, n)),
                        "flotilla_server_leader_changes_seen_total") for n in survivors}
    cluster.nodes[leader].kill()
    new = cluster.wait_leader(30, among=survivors)
    for name in survivors:
        found = wait_for(lambda n=name: samples(scrape(cluster, n)), 5, f"{name}'s metrics")
        assert value(found, "flotilla_server_leader_changes_seen_total") > changes[name]
        assert value(found, "flotilla_server_has_leader") == 1

    # Its last follower dies too: the member left alone counts no leader, within about two
    # election timeouts (the scrape and a loaded machine's scheduling add a little).
    alone = new
    cluster.nodes[next(n for n in survivors if n != new)].kill()
    killed = time.monotonic()
    wait_for(lambda: value(samples(scrape(cluster, alone)), "flotilla_server_has_leader") == 0,
             2 * ELECTION_MS / 1000 + 1.0, f"{alone} to count no leader")
    print(f"has_leader read 0 on {alone} {time.monotonic() - killed:.2f}s after the kill")

    for name, node in cluster.nodes.items():
        records = json_records(node.log_path.read_text())
        assert records, f"{name} logged nothing"
        assert any(r["level"] == "info" and "is leader" in r["message"] for r in records) or \
            any(r["level"] == "info" and "is follower" in r["message"] for r in records)
        assert all(r.get("member") == name for r in records)


def json_records(log: str) -> list[dict[str, Any]]:
    """Every line the member wrote, each one JSON object with the agreed keys (the harness's
    own lines, which mark each start, left out)."""
    records = []
    for line in log.splitlines():
        if line.startswith("--- harness:"):
            continue
        record = json.loads(line)  # fails the test on any line that is not JSON
        assert {"time", "level", "logger", "message"} <= set(record), record
        assert record["time"].endswith("Z"), record
        datetime.fromisoformat(record["time"])  # RFC 3339
        assert record["level"] in ("debug", "info", "warning", "error", "critical"), record
        records.append(record)
    return records


def test_log_level_warning_drops_info_lines(tmp_path):
    with serving(one_member(tmp_path / "n1", "--log-level", "warning")) as node:
        with node.client() as c:
            c.put("k", b"v")  # it became leader and served: info lines it did not log
        node.terminate()
    lines = [line for line in node.log_path.read_text().splitlines()
             if not line.startswith("--- harness:")]
    assert not [line for line in lines if " INFO " in line], lines
