"""The change stage through real Spark (local mode): the change rows of a plan are exactly the
changes the node's machine makes replaying the same entries (found by diffing its state
around each entry, test_kvchanges's oracle), each with its entry's term and time and in the
slice of its index; from a snapshot, its keys come first as READ rows; after a `since`, only
what follows it; and the entries handed over are the log's own."""

from __future__ import annotations

import random

import pytest
from flotilla.node.archive import ClusterArchive, open_archive
from flotilla.node.consensus import EntryKind
from flotilla.node.statemachine.kv import KVStateMachine
from flotilla.pipeline.changes import CHANGE_ROWS, change_stage
from flotilla.pipeline.kvfold import READ, key_bytes
from flotilla.pipeline.source import ENTRY_ROWS, ArchiveRef, arrow_schema, from_blob

from tests.pipeline.archives import write_archive
from tests.pipeline.test_kvchanges import state_changes
from tests.pipeline.test_snapshot_at import history


def blob_rows(frame, ddl: str, stage) -> list[dict]:
    """The rows of a frame of blobs, checking each blob went to the slice of its rows' index
    (READ rows: to one past the slices)."""
    rows = []
    for dest, blob in zip(*frame.select("dest", "blob").toArrow().columns, strict=True):
        found = from_blob(blob.as_py(), arrow_schema(ddl)).to_pylist()
        if dest.as_py() < stage.slices:
            assert {stage.audit.slice_of(r["index"]) for r in found} == {dest.as_py()}
        else:
            assert dest.as_py() < stage.dests and {r["op"] for r in found} == {READ}
        rows += found
    return rows


@pytest.mark.parametrize("seed", range(3))
def test_the_change_rows_are_the_changes_the_node_s_machine_makes(spark, tmp_path, seed):
    rng = random.Random(seed)
    url = (tmp_path / "archive").as_uri()
    log = write_archive(url, "old", history(seed, rng.randrange(80, 300)),
                        snapshot_at=sorted(rng.sample(range(5, 60), 2)),
                        segment_entries=rng.choice([7, 50, 1000]))
    archive = open_archive(url)
    try:
        plans = ClusterArchive(archive, "old").restore_candidates(len(log))
    finally:
        archive.close()
    assert [p.base_index > 0 for p in plans] == [True, True, False]
    for plan in rng.sample(plans, 2):
        base = plan.base_index
        sm = KVStateMachine()
        for entry in log[:base]:
            if entry.kind == EntryKind.NORMAL:
                sm.apply(entry.index, entry.data)
        reads = [(key_bytes(k), base, READ, None, v) for k, v, _ in sm.records()]
        changes = state_changes(sm, [(e.index, e.data) for e in log[base:]
                                     if e.kind == EntryKind.NORMAL])
        since = rng.choice([None, base, rng.randrange(base, len(log))])
        expected = reads + changes if since is None else [c for c in changes if c[1] > since]
        with change_stage(spark, ArchiveRef(url, "old"), plan, since=since,
                          slice_entries=rng.choice([16, 1 << 18]),
                          tasks=rng.choice([1, 3])) as found:
            rows = blob_rows(found.changes, CHANGE_ROWS, found)
            entries = blob_rows(found.entries, ENTRY_ROWS, found)
        assert found.first_index == (base if since is None and base else (since or 0) + 1)
        assert sorted((r["key"], r["index"], r["op"], r["before"], r["after"])
                      for r in rows) == sorted(expected), (plan.describe(), since)
        for r in rows:  # each change carries its entry's term and time
            at = log[r["index"] - 1]
            assert (r["term"], r["ts_ms"]) == (at.term, at.ts_ms)
        assert sorted((e["index"], e["term"], e["ts_ms"], e["kind"], e["data"]) for e in entries) \
            == [(e.index, e.term, e.ts_ms, e.kind, e.data) for e in log
                if e.index >= found.first_index and e.index > base]
