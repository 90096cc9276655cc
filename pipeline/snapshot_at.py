"""`flotilla pipeline snapshot-at`: the exact state at an index, synthesized with Spark and
published into the archive as a new cluster that an unchanged member restores.

The driver plans from the manifest (the plan the node's own restore makes: the newest intact
snapshot at or below N plus the segments covering the rest), reads the base snapshot's header
and sessions, samples the keys, and writes the snapshot file; Spark does the work in between,
in the steps of `kvfold`, through the stages of `stages` (decode, sessions, keys), then:

    keys     per range of keys: the final records and the results the sessions record
    payload  the driver takes the ranges in order: they are the payload's key order
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import msgpack
from flotilla.node.archive import (
    ArchiveError,
    ClusterArchive,
    TimeOutsideArchive,
    format_ms,
)
from flotilla.node.archive.errors import ArchiveNotFound
from flotilla.node.archive.layout import check_cluster_id
from flotilla.node.archive.manifest import SnapshotRecord
from flotilla.node.archive.protocol import sha256_of_file
from flotilla.node.archive.restore import RestorePlan, resolve_cluster_id
from flotilla.node.consensus import Entry, EntryKind, Membership, SnapshotMeta
from flotilla.node.consensus.types import EMPTY_MEMBERSHIP
from flotilla.node.statemachine import StateMachineLoadError, load_state_machine
from flotilla.node.statemachine.kv import KVStateMachine, packer
from flotilla.node.storage import SnapshotStore

from .kvfold import (
    OP_DELETE,
    OP_PUT,
    assemble_payload,
    finish_session,
    fold_changes,
    fold_keys,
)
from .replay import replay_snapshot
from .source import (
    ENTRIES,
    ENTRY_ROWS,
    FLUSH_ENTRIES,
    KEY_ROWS,
    TIMED_KEY_ROWS,
    ArchiveRef,
    Audit,
    arrow_schema,
    cluster_archive,
    from_blob,
    paused_gc,
)
from .spark import PipelineError
from .stages import (
    Base,
    Decoded,
    decode,
    describe_plan,
    fold_sessions,
    key_inputs,
    range_tables,
    read_base,
    release,
    stage,
    table_rows,
    unchecked_shuffles,
)

__all__ = ["SnapshotAtResult", "plan_snapshot_at", "snapshot_at", "state_at"]

@dataclass(frozen=True, slots=True)
class SnapshotAtResult:
    cluster_id: str
    index: int
    term: int
    time: str | None
    location: str
    sha256: str

    def to_json(self) -> str:
        return json.dumps({"cluster_id": self.cluster_id, "index": self.index,
                           "term": self.term, "time": self.time, "location": self.location,
                           "sha256": self.sha256})


def plan_snapshot_at(cluster: ClusterArchive, index: int) -> RestorePlan:
    """The restore plan for `index`, or PipelineError (exit 4) naming what can be rebuilt."""
    try:
        return cluster.plan_restore(index)
    except ArchiveNotFound:
        manifest = cluster.cached_manifest or cluster.manifest()
        ranges = manifest.restorable_ranges() if manifest is not None else []
        held = ", ".join(f"{max(low, 1)}..{high}" for low, high in ranges if high >= 1)
        held = held or "nothing yet"
        raise PipelineError(f"index {index} is outside what {cluster.url} can rebuild "
                            f"(indexes {held}); pick an --index there", 4) from None


@dataclass(frozen=True, slots=True)
class Prepared:
    """A checked job: the cluster resolved, the target resolved to an index, the plan made,
    the target id free (or holding this very result from an earlier run). Made before Spark
    starts, so bad input costs no JVM."""

    ref: ArchiveRef
    plan: RestorePlan
    target: str
    time_ms: int | None = None  # the --time asked for, if any
    exclusive: bool = False
    existing: SnapshotRecord | None = None  # the target's snapshot from an earlier run
    machine: str = "kv"  # the state machine's spec (`module:Class`, or kv)
    sequential: bool = False  # one replay task instead of the key-value fold

    @property
    def folds(self) -> bool:
        return self.machine == "kv" and not self.sequential

    def describe(self) -> dict[str, Any]:
        asked = {} if self.time_ms is None else {
            "requested_time": format_ms(self.time_ms), "exclusive": self.exclusive}
        return {"cluster_id": self.ref.cluster_id, "to_cluster_id": self.target, **asked,
                "state_machine": self.machine,
                "engine": "fold by key" if self.folds else "one sequential replay",
                **describe_plan(self.plan)}


def resolve_index(cluster: ClusterArchive, time_ms: int, exclusive: bool = False) -> int:
    """The index `--time` (with `--exclusive`) names, or PipelineError (exit 4) naming the
    restorable times."""
    try:
        return cluster.index_at_time(time_ms, inclusive=not exclusive)
    except TimeOutsideArchive as exc:
        raise PipelineError(f"{exc}; pick a --time there", 4) from None


def prepare(ref: ArchiveRef, index: int | None, to_cluster_id: str | None = None, *,
            time_ms: int | None = None, exclusive: bool = False, machine: str = "kv",
            sequential: bool = False) -> Prepared:
    """Check a snapshot-at job: exactly one of `index` and `time_ms` (ms since the epoch; the
    last entry stamped at or before it, or before it when `exclusive`); `machine` is the
    state machine's spec (the key-value machine folds in parallel, any other replays in one
    task, as does `sequential`)."""
    if (index is None) == (time_ms is None):
        raise PipelineError("give exactly one of --index and --time", 2)
    try:
        load_state_machine(machine)
    except StateMachineLoadError as exc:
        raise PipelineError(f"--state-machine: {exc}", 2) from None
    archive = ref.open()
    try:
        # A rerun must not count what an earlier run published as a second source cluster
        # (unless it is the only cluster there: then it is the source, refused below).
        try:
            cluster_id = resolve_cluster_id(archive, ref.cluster_id, excluding=to_cluster_id,
                                            id_flag="--cluster-id", url_flag="--archive")
        except ArchiveNotFound:
            if to_cluster_id is None or ref.cluster_id is not None:
                raise
            cluster_id = resolve_cluster_id(archive, None, id_flag="--cluster-id",
                                            url_flag="--archive")
        ref = replace(ref, cluster_id=cluster_id)
        cluster = ref.cluster(archive)
        if time_ms is not None:
            index = resolve_index(cluster, time_ms, exclusive)
        assert index is not None
        plan = plan_snapshot_at(cluster, index)
        target = to_cluster_id or f"{cluster_id}-at-{index}"
        try:
            check_cluster_id(target)
        except ValueError as exc:
            raise PipelineError(f"--to-cluster-id: {exc}", 2) from None
        if target == cluster_id:
            raise PipelineError(f"--to-cluster-id {target!r} is the source cluster itself: "
                                "pick a new id", 2)
        existing = _earlier_result(ref.cluster(archive, target), index, ref.url)
        return Prepared(ref, plan, target, time_ms, exclusive, existing, machine, sequential)
    except ArchiveError as exc:
        raise PipelineError(f"cannot read {ref.url}: {exc}") from None
    finally:
        archive.close()


def _earlier_result(out: ClusterArchive, index: int, url: str) -> SnapshotRecord | None:
    """The snapshot an earlier run of this job published as `out`, or None if `out` is free.
    A cluster that is anything else (other indexes, segments) is refused: an id is never
    reused for different data."""
    manifest = out.manifest()
    if manifest is None:
        return None
    snaps = manifest.snapshots
    if manifest.segments or len(snaps) != 1 or snaps[0].index != index:
        raise PipelineError(f"{url} already holds a cluster {out.cluster_id!r} that is not the "
                            f"state at index {index}: pick another --to-cluster-id", 2)
    return snaps[0]


def snapshot_at(spark: Any, ref: ArchiveRef, index: int | None = None, *,
                to_cluster_id: str | None = None, tasks: int | None = None,
                prepared: Prepared | None = None, time_ms: int | None = None,
                exclusive: bool = False, machine: str = "kv",
                sequential: bool = False) -> SnapshotAtResult:
    """Synthesize the state at `index` (or after the last entry stamped at or before
    `time_ms`) and publish it as a new cluster. Running it again with the same target gives
    the same result: the bytes are compared, never overwritten."""
    job = prepared or prepare(ref, index, to_cluster_id, time_ms=time_ms, exclusive=exclusive,
                              machine=machine, sequential=sequential)
    ref, plan, target = job.ref, job.plan, job.target
    archive = ref.open()
    try:
        with tempfile.TemporaryDirectory(prefix="flotilla-snapshot-at-") as work:
            if job.folds:
                path, meta = state_at(spark, ref, plan, Path(work), tasks)
            else:
                path, meta = replay_snapshot(spark, ref, plan, job.machine, Path(work))
            out = ref.cluster(archive, target)
            if job.existing is not None:
                record = job.existing
                with open(path, "rb") as file:
                    same = sha256_of_file(file) == record.sha256
                if not same:
                    raise PipelineError(
                        f"{out.location(record)} already holds a different state at index "
                        f"{plan.index}: pick another --to-cluster-id", 2)
            else:
                record = out.upload_snapshot(path, meta)
                out.publish()
            time = format_ms(meta.ts_ms) if meta.ts_ms else None
            return SnapshotAtResult(target, plan.index, meta.term, time,
                                    out.location(record), record.sha256)
    except ArchiveError as exc:
        raise PipelineError(f"cannot read {ref.url}: {exc}") from None
    finally:
        archive.close()


def state_at(spark: Any, ref: ArchiveRef, plan: RestorePlan, work: Path,
             tasks: int | None = None) -> tuple[Path, SnapshotMeta]:
    """The key-value machine's snapshot at `plan.index`, folded by Spark into a file under
    `work`, and its metadata."""
    base_meta, base = read_base(cluster_archive(ref), plan, work)
    ops = decode(spark, ref, plan, base, tasks=tasks)
    meta = _meta_at(ops, plan, base_meta)
    return _synthesize(spark, ref, plan, ops, meta, base, work), meta


@dataclass
class Cleaned:
    """What `compact` takes from one run over a plan's entries (`state_and_changes`)."""

    path: Path  # the snapshot at the plan's index
    meta: SnapshotMeta
    last: dict[bytes, tuple[int, int]]  # key -> (index, OP_PUT or OP_DELETE) of its last change
    entries: list[Entry]  # the entries at those indexes, as the log holds them


def state_and_changes(spark: Any, ref: ArchiveRef, plan: RestorePlan, work: Path,
                      tasks: int | None = None) -> Cleaned:
    """One decode of the plan's entries for compaction: the snapshot at its index (exactly
    snapshot-at's), each key's last effective change after the plan's base (`fold_changes`
    over the same key rows, in the same tasks), and the entries of those changes, picked from
    the decoded entries by the tasks that hold them. The archive is read once."""
    import numpy as np
    from pyspark.sql import functions as F

    base_meta, base = read_base(cluster_archive(ref), plan, work)
    audit = Audit(plan.base_index, 1 << 62)  # every entry after the base, in one slice
    ops = decode(spark, ref, plan, base, tasks=tasks, job="compact", audit=audit)
    try:
        meta = _meta_at(ops, plan, base_meta)
        last: dict[bytes, tuple[int, int]] = {}
        with unchecked_shuffles(spark):
            path = _fold(spark, ref, plan, ops, meta, base, work, changes=last, job="compact")
        wanted = spark.sparkContext.broadcast(
            np.array(sorted(i for i, _ in last.values()), dtype=np.int64).tobytes())

        def pick(batches: Iterator[Any]) -> Iterator[Any]:
            import numpy as np
            import pyarrow as pa
            import pyarrow.compute as pc

            keep = pa.array(np.frombuffer(wanted.value, dtype=np.int64))
            schema = arrow_schema(ENTRY_ROWS)
            for batch in batches:
                for blob in batch.column(0).to_pylist():
                    rows = from_blob(blob, schema)
                    rows = rows.filter(pc.is_in(rows.column("index"), value_set=keep))
                    if rows.num_rows:
                        yield rows.select(["index", "term", "kind", "data", "ts_ms"])

        with stage(spark, "compact", "entries"):
            table = ops.frame.filter(F.col("kind") == ENTRIES).select("blob").mapInArrow(
                pick, "index long, term long, kind byte, data binary, ts_ms long").toArrow()
        wanted.unpersist()
    finally:
        release(ops.frame)
    order = table.column("index").to_numpy().argsort(kind="stable")
    columns = [table.column(name).take(order).to_pylist()
               for name in ("index", "term", "kind", "data", "ts_ms")]
    entries = [Entry(i, t, EntryKind(k), d, ts) for i, t, k, d, ts in zip(*columns, strict=True)]
    return Cleaned(path, meta, last, entries)


def _meta_at(ops: Decoded, plan: RestorePlan, base_meta: SnapshotMeta | None) -> SnapshotMeta:
    """Term of the target entry and the configuration in force there (the last membership
    entry at or below it, else the base snapshot's)."""
    index = plan.index
    if index == plan.base_index and base_meta is not None:
        return base_meta
    stats = ops.stats
    found = [s.target for s in stats if s.target is not None]
    if not found:
        raise PipelineError(f"entry {index} is missing from the archived segments")
    changes = sorted(change for s in stats for change in s.memberships)
    if changes:
        membership = Membership.decode(changes[-1][1])
    elif base_meta is not None:
        membership = base_meta.membership
    else:
        # The first configuration lives only in each member's bootstrap snapshot, never in
        # the log or the archive. A restore takes its configuration from --initial-cluster and
        # reads only the payload, which is exact either way.
        membership = EMPTY_MEMBERSHIP
    term, ts_ms = found[0]
    return SnapshotMeta(index, term, membership, ts_ms)


def _synthesize(spark: Any, ref: ArchiveRef, plan: RestorePlan, ops: Decoded,
                meta: SnapshotMeta, base: Base, work: Path) -> Path:
    with unchecked_shuffles(spark):
        return _fold(spark, ref, plan, ops, meta, base, work)


def _fold(spark: Any, ref: ArchiveRef, plan: RestorePlan, ops: Decoded, meta: SnapshotMeta,
          base: Base, work: Path, changes: dict[bytes, tuple[int, int]] | None = None,
          job: str = "snapshot-at") -> Path:
    """The sessions stage, then the keys stage, then the payload. Spark moves the decode
    stage's blobs to the task of their bucket or range; the tasks fold them.

    With `changes` (a dict to fill; `ops` decoded with an `Audit`, so timed key rows), the
    key stage's tasks also run `fold_changes` over the same rows and hand back each key's
    last effective change after the base, and the decoded blobs are left for the caller to
    release."""
    from pyspark.sql import functions as F

    stats = ops.stats
    last_normal = max((s.last_normal for s in stats if s.last_normal is not None), default=None)
    applied = base.applied_index if last_normal is None else last_normal
    ttl, window = base.ttl_ms, base.window
    done = fold_sessions(spark, ops, base, job)
    wanted, skipped = done.wanted, done.skipped
    timed = changes is not None
    since = plan.base_index

    # Keys, per range of keys: the commands not answered from a session and every base
    # entry. The partitions in order are the ranges in order: the payload's.
    def fold_ranges(batches: Iterator[Any]) -> Iterator[Any]:
        out = arrow_schema(_FOLDED)
        pack = packer().pack
        rows_schema = arrow_schema(TIMED_KEY_ROWS if timed else KEY_ROWS)
        for dest, table in range_tables(batches, rows_schema, skipped.value):
            results: dict[int, dict[str, Any]] = {}
            run: list[bytes] = []
            for record in fold_keys(table_rows(table, 5), wanted, results):
                run.append(record)
                if len(run) == FLUSH_ENTRIES:
                    yield _folded_batch(out, dest, run, {})
                    run = []
            yield _folded_batch(out, dest, run, {i: pack(r) for i, r in results.items()})
            if timed:
                last: dict[bytes, tuple[int, int]] = {}
                for key, index, _, _, after in fold_changes(table_rows(table, 5), since):
                    last[key] = (index, OP_DELETE if after is None else OP_PUT)
                yield _changes_batch(out, dest, last)

    per_key = key_inputs(spark, ref, plan, ops, base, timed=timed)
    folded = per_key.mapInArrow(lambda batches: paused_gc(fold_ranges(batches)),
                                _FOLDED).cache()
    try:
        results: dict[int, dict[str, Any]] = {}
        key_count = 0
        with stage(spark, job, "keys"):
            found = folded.select("n", "rindex", "result").collect()
        for n, index, result in found:
            if index is None:
                key_count += n
            elif n == _CHANGE:
                assert changes is not None
                changes[bytes(result[1:])] = (index, result[0])  # bytearray before 4.1
            else:
                results[index] = msgpack.unpackb(result, raw=False, strict_map_key=False)
        sessions = [finish_session(s, results) for s in done.sketches.values()]
        sessions += [s for c, s in base.sessions.items() if c not in done.sketches]
        runs = folded.filter(F.col("run").isNotNull()).select("dest", "run")

        def key_records() -> Iterator[bytes]:
            """The runs in range order, a few ranges at a time, through Arrow: collect() and
            toLocalIterator() send binary through a pickler that turns every byte array into
            a latin-1 string (a sixth of the JVM's CPU on 3M entries)."""
            for low in range(0, len(ops.bounds) + 1, RANGES_PER_FETCH):
                some = runs.filter(F.col("dest").between(low, low + RANGES_PER_FETCH - 1))
                yield from some.toArrow().column("run").to_pylist()

        def write(stream: Any) -> None:
            assemble_payload(stream, applied_index=applied, clock=done.clock, ttl_ms=ttl,
                             window=window, key_count=key_count, key_records=key_records(),
                             sessions=sessions)

        with stage(spark, job, "payload"):
            return SnapshotStore(work / "out").save(meta, KVStateMachine.kind, write)
    finally:
        folded.unpersist()
        if not timed:
            release(ops.frame)  # the last stage to read it
        skipped.unpersist()


_FOLDED = "dest int, run binary, n long, rindex long, result binary"
_CHANGE = -1  # n of a row that is a key's last change: rindex its index, result op + key
RANGES_PER_FETCH = 8  # key ranges the driver fetches at a time while it writes the payload


def _changes_batch(schema: Any, dest: int, last: dict[bytes, tuple[int, int]]) -> Any:
    """Each key's last change as a row of _FOLDED: n _CHANGE, rindex the index, result the
    op (one byte) then the key."""
    import pyarrow as pa

    count = len(last)
    return pa.RecordBatch.from_arrays(
        [pa.array([dest] * count, pa.int32()), pa.nulls(count, pa.binary()),
         pa.array([_CHANGE] * count, pa.int64()),
         pa.array([i for i, _ in last.values()], pa.int64()),
         pa.array([bytes([op]) + key for key, (_, op) in last.items()], pa.binary())],
        schema=schema)


def _folded_batch(schema: Any, dest: int, run: list[bytes], results: dict[int, bytes]) -> Any:
    """One run of packed key records, then the results the sessions record."""
    import pyarrow as pa

    count = len(results)
    return pa.RecordBatch.from_arrays(
        [pa.array([dest] * (count + 1), pa.int32()),
         pa.array([b"".join(run), *[None] * count], pa.binary()),
         pa.array([len(run), *[None] * count], pa.int64()),
         pa.array([None, *results], pa.int64()),
         pa.array([None, *results.values()], pa.binary())], schema=schema)


