"""The sequential path of `snapshot-at`: one task replays the plan through the machine itself.

A user's state machine is a black box: its `apply` may read any of its state, so the commands
cannot be split by key the way the key-value fold splits them. The plan is the same (the newest
intact snapshot at or below the target, then the archived entries up to it); one Spark task
restores the base snapshot into a fresh machine, applies every command in index order, writes
the machine's snapshot payload and streams it back to the driver in chunks, which the driver
writes in the node's snapshot format. That is exactly what a member does when it restores, so
the bytes match by construction; the gain over `flotilla node --restore-index` is only that it
runs where the Spark cluster is, next to the archive. `--sequential` takes this path for the
key-value machine too (a cross-check of the fold, and the baseline the benchmark compares).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from flotilla.node.archive import ArchiveError
from flotilla.node.archive.restore import RestorePlan
from flotilla.node.consensus import EntryKind, Membership, SnapshotMeta
from flotilla.node.consensus.types import EMPTY_MEMBERSHIP
from flotilla.node.statemachine import load_state_machine
from flotilla.node.storage import PayloadReader, SnapshotStore

from .source import ArchiveRef

__all__ = ["CHUNK", "replay_snapshot"]

CHUNK = 4 << 20  # payload bytes per row streamed back to the driver
_SCHEMA = "part long, data binary, term long, ts_ms long, membership binary"


def replay_snapshot(spark: Any, ref: ArchiveRef, plan: RestorePlan, spec: str,
                    work: Path) -> tuple[Path, SnapshotMeta]:
    """Replay `plan` through the machine `spec` names in one task; returns the snapshot file
    (in `work`) and its metadata."""

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        for _ in batches:  # one row: this task's whole job
            yield from (pa.RecordBatch.from_pylist([row], schema=_arrow_schema())
                        for row in _replay(ref, plan, spec))

    frame = spark.createDataFrame([(plan.index,)], "index long").repartition(1)
    rows = frame.mapInArrow(run, _SCHEMA).toLocalIterator()
    head = next(rows)
    membership = (EMPTY_MEMBERSHIP if head["membership"] is None
                  else Membership.decode(head["membership"]))
    meta = SnapshotMeta(plan.index, head["term"], membership, head["ts_ms"])
    kind = load_state_machine(spec).kind

    def write(stream: Any) -> None:
        for row in rows:
            stream.write(row["data"])

    return SnapshotStore(work / "out").save(meta, kind, write), meta


def _replay(ref: ArchiveRef, plan: RestorePlan, spec: str) -> Iterator[dict[str, Any]]:
    """In the task: a header row (term, time and configuration at the target), then the
    payload in order."""
    from .source import cluster_archive

    archive = cluster_archive(ref)
    machine = load_state_machine(spec)
    term = ts_ms = 0
    membership: bytes | None = None
    with tempfile.TemporaryDirectory(prefix="flotilla-replay-") as tmp:
        if plan.snapshot is not None:
            path = Path(tmp) / "base.snap"
            base = archive.download_snapshot(plan.snapshot, path)
            with PayloadReader(path) as payload:
                if payload.kind != machine.kind:
                    raise ArchiveError(
                        f"{archive.location(plan.snapshot)} is a snapshot of the "
                        f"{payload.kind!r} machine, not of {spec!r} ({machine.kind!r}): pass "
                        "that machine's --state-machine")
                machine.restore(payload)
            path.unlink()
            term, ts_ms = base.term, base.ts_ms
            if base.membership != EMPTY_MEMBERSHIP:
                membership = base.membership.encode()
        for entry in archive.read_segments(plan):
            if entry.kind == EntryKind.NORMAL:
                machine.apply(entry.index, entry.data)
            elif entry.kind == EntryKind.MEMBERSHIP:
                membership = entry.data
            term, ts_ms = entry.term, entry.ts_ms
        yield {"part": -1, "data": None, "term": term, "ts_ms": ts_ms, "membership": membership}
        out = Path(tmp) / "payload"
        with open(out, "wb") as stream:
            machine.write_snapshot(stream)
        with open(out, "rb") as stream:
            part = 0
            while chunk := stream.read(CHUNK):
                yield {"part": part, "data": chunk, "term": None, "ts_ms": None,
                       "membership": None}
                part += 1


def _arrow_schema() -> Any:
    import pyarrow as pa

    return pa.schema([("part", pa.int64()), ("data", pa.binary()), ("term", pa.int64()),
                      ("ts_ms", pa.int64()), ("membership", pa.binary())])
