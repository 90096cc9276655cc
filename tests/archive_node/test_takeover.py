"""A leader that takes over archiving first checks that the archive holds its cluster's history:
the term the archive records for its last archived entry must be the term its own log holds
there. Here someone with write access to the store has rewritten the archive consistently
(object, recorded checksum and manifest), so every checksum matches; the member that leads
after a restart refuses to ship on top of it, says so in its log, in ``/v1/status`` and in its
metrics, and ships nothing, not even when asked for a snapshot."""

from __future__ import annotations

import hashlib
import re
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from flotilla.node.archive import ClusterArchive, Manifest
from flotilla.node.archive.segments import encode_segment
from flotilla.node.consensus import Entry, EntryKind

from tests.archive_node.support import FAST, Store, Writer, archive_status, wait_archived
from tests.harness.kvclient import KVClient
from tests.harness.polling import wait_for

FORGED_TERM = 99


def forge_last_term(cluster: ClusterArchive, root: Path) -> tuple[int, int]:
    """Rewrite the segment holding the last archived entry with that entry's term changed, its
    sidecar checksum and a new manifest to match; returns (index, the genuine term)."""
    manifest = cluster.manifest()
    assert manifest is not None
    record = next(s for s in manifest.segments if s.last == manifest.last_archived_index)
    found = cluster.read_segment(record)
    genuine = found[-1].term
    forged = encode_segment(cluster.cluster_id,
                            [*found[:-1], replace(found[-1], term=FORGED_TERM)])
    path = root / cluster.cluster_id / record.key
    path.write_bytes(forged)
    digest = hashlib.sha256(forged).hexdigest()
    path.with_name(path.name + ".sha256").write_text(f"{digest}  {path.name}\n")
    segments = [replace(s, sha256=digest, size=len(forged)) if s.key == record.key else s
                for s in manifest.segments]
    cluster.publish(Manifest.create(manifest.cluster_id, manifest.seq + 1, manifest.created,
                                    manifest.snapshots, segments, manifest.retention_floor))
    return record.last, genuine


def forge_entries_beyond(cluster: ClusterArchive, count: int) -> tuple[int, None]:
    """Archive `count` made-up entries after the last archived one; returns (their last index,
    None: the member's log has no term there)."""
    manifest = cluster.manifest()
    assert manifest is not None
    first = manifest.last_archived_index + 1
    cluster.upload_segment([Entry(i, FORGED_TERM, EntryKind.NOOP, b"", 0)
                            for i in range(first, first + count)])
    cluster.publish()
    return first + count - 1, None


def archive_files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def errors_total(url: str) -> int:
    with KVClient(url) as client:
        text = client.request("GET", "/metrics").body.decode()
    found = re.search(r"^flotilla_archive_errors_total (\d+)", text, re.M)
    assert found, f"no flotilla_archive_errors_total in /metrics:\n{text[:2000]}"
    return int(found.group(1))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("forgery", ["term", "beyond"])
def test_a_leader_ships_nothing_onto_an_archive_that_is_not_its_history(
        local_cluster, file_store: Store, forgery):
    cluster = local_cluster(1, extra_args=file_store.archive_flags(segment_entries=8), **FAST)
    node = cluster.nodes["n0"]
    cluster.wait_leader()
    with Writer([node.url]) as writer:
        for n in range(20):
            writer.put(f"tk/{n % 5}", f"v{n}")
        last = writer.writes[-1].index
    wait_archived(cluster, "n0", last)
    node.kill()

    root = Path(urlsplit(file_store.url).path)
    archive = file_store.cluster_archive(cluster.cluster_id)
    try:
        if forgery == "term":
            index, genuine = forge_last_term(archive, root)
        else:
            index, genuine = forge_entries_beyond(archive, 50)
        before = archive_files(root)
    finally:
        archive.archive.close()

    node.restart()
    cluster.wait_leader()
    said = ("has term 99 in the archive but term " if forgery == "term"
            else f"holds entries up to index {index} (term 99), beyond this leader's log")

    def refused() -> str | None:
        error = archive_status(cluster, "n0")["error"]
        return error if error and said in error else None

    error = wait_for(refused, 30, "the new leader to refuse the archive")
    assert f"index {index}" in error, error
    if forgery == "term":
        assert f"term {genuine} in this leader's log" in error, error
    log = node.log_tail(200)
    assert any(" ERROR " in line and f"index {index}" in line and "term 99" in line
               for line in log.splitlines()), f"no ERROR names index {index}:\n{log}"

    # It keeps refusing, round after round, and ships nothing: not the writes that follow,
    # not the snapshot asked for.
    seen = errors_total(node.url)
    assert seen >= 1
    with Writer([node.url]) as writer:
        for n in range(10):
            writer.put(f"tk/after{n}", "x")
    with node.client(timeout=30) as client:
        asked = client.request("POST", "/v1/snapshot")
    assert asked.status == 503, (asked.status, asked.body[:300])
    assert said in asked.json()["error"]
    wait_for(lambda: errors_total(node.url) >= seen + 2, 30, "two more refused rounds")
    assert archive_files(root) == before
    assert archive_status(cluster, "n0")["last_archived_index"] <= index
