"""The change stage: every effective change of a range of the log, computed with Spark.

The same stages as snapshot-at (`stages`: the base snapshot read, decode, sessions, the key
stage's inputs), with the key stage folding each range of keys into change rows
(`kvfold.fold_changes`) instead of final records. The plan is a restore plan: its base state
(the snapshot, or the empty state) and its entries up to its index. Rows at or below `since`
only build the state: the changes and entries handed over are those after it, so an
incremental run takes a plan whose snapshot is at or below its previous high water and asks
for what follows it.

What comes out is blobs (Arrow batches of CHANGE_ROWS, or of ENTRY_ROWS for the entries
themselves), each for the slice of indexes its rows fall in: `slice_entries` consecutive
indexes per slice, counted from index 1, so the cut depends on the indexes alone, never on
the cores. A consumer that wants one task per slice hands the frames to `stages.exactly`.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

from flotilla.node.archive.restore import RestorePlan

from .kvfold import READ, fold_changes
from .source import (
    DECODED,
    ENTRIES,
    FLUSH_ENTRIES,
    TIMED_KEY_ROWS,
    ArchiveRef,
    Audit,
    PartStats,
    arrow_schema,
    paused_gc,
    to_blob,
)
from .stages import (
    decode,
    fold_sessions,
    key_inputs,
    range_tables,
    read_base,
    release,
    table_rows,
)

__all__ = ["CHANGES", "CHANGE_ROWS", "ChangeStage", "change_stage"]

# An effective change (kvfold.Change) with its entry's term and time; a READ row has the base
# snapshot's index, term and time.
CHANGE_ROWS = ("key binary, index long, op string, before binary, after binary, term long, "
               "ts_ms long")
CHANGES = 4  # a kind of DECODED blob (after source's SESSIONS, KEYS, ENTRIES): CHANGE_ROWS


@dataclass(frozen=True, slots=True)
class ChangeStage:
    """The change stage of one plan, as lazy Spark frames of DECODED rows (kind, dest, blob),
    dest being the slice of the rows' indexes (`audit.slice_of`, 0 to `slices` - 1), except
    for READ rows: `slices` + their range of keys (they share one index, and a snapshot may
    hold millions of keys). Valid inside `change_stage`'s `with` block only."""

    changes: Any  # blobs of CHANGE_ROWS, kind CHANGES
    entries: Any  # blobs of ENTRY_ROWS, kind ENTRIES: every entry from `first_index` on
    slices: int
    read_ranges: int  # the dests after `slices`: READ rows by range of keys (0: no READ rows)
    audit: Audit  # audit.since + 1 is the lowest index a row can have
    read: tuple[int, int, int] | None  # the READ rows' (index, term, ts_ms), if any
    stats: list[PartStats]  # the decode stage's, by part

    @property
    def first_index(self) -> int:
        return self.audit.since + 1

    @property
    def dests(self) -> int:
        return self.slices + self.read_ranges


@contextmanager
def change_stage(spark: Any, ref: ArchiveRef, plan: RestorePlan, *, since: int | None = None,
                 slice_entries: int = 1 << 18, tasks: int | None = None,
                 job: str = "export") -> Iterator[ChangeStage]:
    """The effective changes of `plan`'s entries after index `since`, which must be at or
    above the plan's base index (the state up to it is built from the plan, not handed over);
    or, with `since` None, all of the plan's, its base snapshot's keys first, as READ rows at
    the snapshot's index (the state before the plan's first entry). `ref` names a resolved
    cluster; `job` describes the Spark jobs.

    Runs the decode and sessions stages now; the decoded entries stay on the executors'
    disks until the block ends. The key stage runs whenever `changes` is read."""
    from pyspark.sql import functions as F

    if since is not None and since < plan.base_index:
        raise ValueError(f"the changes after index {since} are not all in a plan from the "
                         f"snapshot at {plan.base_index}")
    archive = ref.open()
    try:
        with tempfile.TemporaryDirectory(prefix=f"flotilla-{job}-") as work:
            meta, base = read_base(ref.cluster(archive), plan, Path(work))
    finally:
        archive.close()
    read = None
    if since is None and meta is not None:
        read = (meta.index, meta.term, meta.ts_ms)
    after = (read[0] - 1 if read else 0) if since is None else since
    audit = Audit(after, slice_entries, after // slice_entries)
    ops = decode(spark, ref, plan, base, tasks=tasks, job=job, audit=audit)
    skipped = fold_sessions(spark, ops, base, job).skipped
    try:
        slices = audit.slice_of(plan.index) + 1

        def fold_ranges(batches: Iterator[Any]) -> Iterator[Any]:
            for dest, table in range_tables(batches, arrow_schema(TIMED_KEY_ROWS),
                                            skipped.value):
                yield from _change_blobs(table, audit, read, slices + dest)

        changes = key_inputs(spark, ref, plan, ops, base, timed=True).mapInArrow(
            lambda batches: paused_gc(fold_ranges(batches)), DECODED)
        entries = ops.frame.filter(F.col("kind") == ENTRIES)
        yield ChangeStage(changes, entries, slices, len(ops.bounds) + 1 if read else 0, audit,
                          read, ops.stats)
    finally:
        release(ops.frame)
        skipped.unpersist()


def _change_blobs(table: Any, audit: Audit, read: tuple[int, int, int] | None,
                  read_dest: int) -> Iterator[Any]:
    """The changes of one range's table (TIMED_KEY_ROWS in fold order) as DECODED batches of
    CHANGE_ROWS blobs by slice (READ rows: for `read_dest`). A change's term and time are its
    command's row's: found by index in the table sorted by index (a range's indexes are
    distinct: a command changes one key, and base entries' mod indexes are distinct and below
    every command's)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    schema, out = arrow_schema(CHANGE_ROWS), arrow_schema(DECODED)
    order = pc.sort_indices(table["index"])
    indexes = table["index"].take(order).to_numpy()
    terms = table["term"].take(order).fill_null(0).to_numpy()
    times = table["ts_ms"].take(order).fill_null(0).to_numpy()
    found = fold_changes(table_rows(table, 5), audit.since,
                         None if read is None else read[0])
    while chunk := list(islice(found, FLUSH_ENTRIES)):
        keys, at, ops, before, after = zip(*chunk, strict=True)
        at = np.array(at, dtype=np.int64)
        rows = np.searchsorted(indexes, at)
        term, ts = terms[rows], times[rows]
        dests = (at - 1) // audit.slice_entries - audit.first_slice
        if read is not None:
            reads = np.array(ops) == READ
            term[reads], ts[reads], dests[reads] = read[1], read[2], read_dest
        batch = pa.RecordBatch.from_arrays(
            [pa.array(keys, pa.binary()), pa.array(at), pa.array(ops, pa.string()),
             pa.array(before, pa.binary()), pa.array(after, pa.binary()), pa.array(term),
             pa.array(ts)], schema=schema)
        cut = np.unique(dests)
        blobs = [to_blob(batch)] if len(cut) == 1 else [
            to_blob(batch.filter(pa.array(dests == dest))) for dest in cut]
        yield pa.RecordBatch.from_arrays(
            [pa.array([CHANGES] * len(cut), pa.int8()), pa.array(cut, pa.int32()),
             pa.array(blobs, pa.binary())], schema=out)
