"""`flotilla pipeline snapshot-at`: the exact state at an index, synthesized with Spark and
published into the archive as a new cluster that an unchanged member restores.

The driver plans from the manifest (the plan the node's own restore makes: the newest intact
snapshot at or below N plus the segments covering the rest) and writes the snapshot file; Spark
does the work in between, in the stages of `kvfold`:

    segments --decode--> ops (cached)
    ops --per-segment max ts--> clock offsets (driver) --window--> each command's clock
    client commands --by client, in index order--> skipped indexes + session sketches
    effective commands (+ the base keys they touch) --by key, in index order--> final records
    final records + untouched base records --sorted by key--> packed runs --> the payload

Keys travel as UTF-8 bytes (lone surrogates kept), so Spark's binary sort is the machine's
code-point order. Each "by X" stage is a hash repartition plus a sort within partitions and one
Python call per Arrow batch, never one per key.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
from flotilla.node.archive import (
    ArchiveError,
    ClusterArchive,
    TimeOutsideArchive,
    format_ms,
    open_archive,
)
from flotilla.node.archive.errors import ArchiveNotFound
from flotilla.node.archive.layout import check_cluster_id
from flotilla.node.archive.manifest import SnapshotRecord
from flotilla.node.archive.protocol import sha256_of_file
from flotilla.node.archive.restore import RestorePlan, resolve_cluster_id
from flotilla.node.consensus import EntryKind, Membership, SnapshotMeta
from flotilla.node.consensus.types import EMPTY_MEMBERSHIP
from flotilla.node.statemachine import StateMachineLoadError, load_state_machine
from flotilla.node.statemachine.kv import KVStateMachine, packer
from flotilla.node.statemachine.sessions import Session
from flotilla.node.storage import PayloadReader, SnapshotStore

from .kvfold import Op, SessionSketch, assemble_payload, finish_session, fold_client, fold_key
from .replay import replay_snapshot
from .source import BAD, DELETE, OPS_SCHEMA, PUT, ArchiveRef, decode_segments, key_text
from .spark import PipelineError

__all__ = ["SnapshotAtResult", "plan_snapshot_at", "snapshot_at"]

BASE = 2  # op code of a base snapshot's key record in the key stage


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
                **_describe(self.plan)}


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
    archive = open_archive(ref.url, endpoint=ref.s3_endpoint, region=ref.s3_region)
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
        ref = ArchiveRef(ref.url, cluster_id, ref.s3_endpoint, ref.s3_region)
        cluster = ClusterArchive(archive, cluster_id)
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
        existing = _earlier_result(ClusterArchive(archive, target), index, ref.url)
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
    archive = open_archive(ref.url, endpoint=ref.s3_endpoint, region=ref.s3_region)
    try:
        cluster = ClusterArchive(archive, ref.cluster_id)
        with tempfile.TemporaryDirectory(prefix="flotilla-snapshot-at-") as work:
            if job.folds:
                base_meta, base = _read_base(cluster, plan, Path(work))
                ops = _ops(spark, ref, plan, tasks)
                meta = _meta_at(ops, plan, base_meta)
                path = _synthesize(spark, ref, plan, ops, meta, base, Path(work))
            else:
                path, meta = replay_snapshot(spark, ref, plan, job.machine, Path(work))
            out = ClusterArchive(archive, target)
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


def _describe(plan: RestorePlan) -> dict[str, Any]:
    snap = plan.snapshot
    return {"index": plan.index,
            "base_snapshot": None if snap is None else {"key": snap.key, "index": snap.index,
                                                        "bytes": snap.size},
            "segments": [{"key": s.key, "first": s.first, "last": s.last, "bytes": s.size}
                         for s in plan.segments],
            "bytes": (snap.size if snap else 0) + sum(s.size for s in plan.segments)}


@dataclass(frozen=True, slots=True)
class _Base:
    """The base snapshot as the driver needs it: all but its key records (read by a task)."""

    applied_index: int
    clock: int
    ttl_ms: int
    window: int
    sessions: dict[str, Session]
    path: Path | None


def _read_base(cluster: ClusterArchive, plan: RestorePlan,
               work: Path) -> tuple[SnapshotMeta | None, _Base]:
    if plan.snapshot is None:
        empty = KVStateMachine()
        return None, _Base(0, 0, empty.session_ttl_ms, empty.session_window, {}, None)
    path = work / "base.snap"
    meta = cluster.download_snapshot(plan.snapshot, path)
    sm = KVStateMachine()
    with PayloadReader(path) as payload:
        if payload.kind != sm.kind:
            raise PipelineError(f"{cluster.location(plan.snapshot)} is a snapshot of the "
                                f"{payload.kind!r} machine, not of the key-value machine: "
                                "pass that machine's --state-machine module:Class", 2)
        sm.restore(payload)
    sessions = {s.client: s for s in sm.sessions()}
    return meta, _Base(sm.applied_index, sm.clock, sm.session_ttl_ms, sm.session_window,
                       sessions, path)


def _ops(spark: Any, ref: ArchiveRef, plan: RestorePlan, tasks: int | None) -> Any:
    """Every entry after the base up to the target, decoded by a few large tasks."""
    segments = list(plan.segments)
    parallel = tasks or spark.sparkContext.defaultParallelism
    chunks = [segments[i::parallel] for i in range(min(parallel, len(segments)))]
    rows = [(json.dumps([s.to_json() for s in chunk]),) for chunk in chunks]
    upto, above = plan.index, plan.base_index

    def decode_chunks(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa
        from flotilla.node.archive.manifest import SegmentRecord

        for batch in batches:
            for doc in batch.column(0).to_pylist():
                records = [SegmentRecord(d["first"], d["last"], d["key"], d["bytes"],
                                         d["sha256"]) for d in json.loads(doc)]
                for cols in decode_segments(ref, upto, records, above):
                    yield pa.RecordBatch.from_pydict(cols, schema=_arrow(OPS_SCHEMA))

    frame = spark.createDataFrame(rows or [("[]",)], "segments string").repartition(
        max(1, len(rows)))
    return frame.mapInArrow(decode_chunks, OPS_SCHEMA).cache()


def _arrow(ddl: str) -> Any:
    import pyarrow as pa

    types = {"long": pa.int64(), "byte": pa.int8(), "binary": pa.binary(),
             "string": pa.string()}
    return pa.schema([(name, types[kind]) for name, kind in
                      (part.split() for part in ddl.split(", "))])


def _meta_at(ops: Any, plan: RestorePlan, base_meta: SnapshotMeta | None) -> SnapshotMeta:
    """Term of the target entry and the configuration in force there (the last membership
    entry at or below it, else the base snapshot's)."""
    from pyspark.sql import functions as F

    index = plan.index
    if index == plan.base_index and base_meta is not None:
        return base_meta
    found = ops.filter(F.col("index") == index).select("term", "ts_ms").collect()
    if not found:
        raise PipelineError(f"entry {index} is missing from the archived segments")
    change = (ops.filter(F.col("kind") == int(EntryKind.MEMBERSHIP))
              .orderBy(F.col("index").desc()).select("data").limit(1).collect())
    if change:
        membership = Membership.decode(change[0]["data"])
    elif base_meta is not None:
        membership = base_meta.membership
    else:
        # The first configuration lives only in each member's bootstrap snapshot, never in
        # the log or the archive. A restore takes its configuration from --initial-cluster and
        # reads only the payload, which is exact either way.
        membership = EMPTY_MEMBERSHIP
    return SnapshotMeta(index, found[0]["term"], membership, found[0]["ts_ms"])


def _synthesize(spark: Any, ref: ArchiveRef, plan: RestorePlan, ops: Any, meta: SnapshotMeta,
                base: _Base, work: Path) -> Path:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    commands = ops.filter(F.col("kind") == int(EntryKind.NORMAL))
    decodable = commands.filter(F.col("op") != BAD)

    # The clock: per-segment maxima, a prefix over segments on the driver, then a running
    # maximum within each segment.
    maxima = sorted((r["seg"], r["m"]) for r in
                    decodable.groupBy("seg").agg(F.max("ts").alias("m")).collect())
    before, clock = {}, base.clock
    for seg, most in maxima:
        before[seg] = clock
        clock = max(clock, most)
    final_clock = clock
    offsets = spark.createDataFrame(list(before.items()) or [(0, 0)], "seg long, start long")
    running = Window.partitionBy("seg").orderBy("index").rowsBetween(
        Window.unboundedPreceding, Window.currentRow)
    clocked = (decodable.withColumn("run", F.max("ts").over(running))
               .join(F.broadcast(offsets), "seg")
               .withColumn("clock", F.greatest("run", "start")))

    # Sessions, per client.
    ttl, window, base_sessions = base.ttl_ms, base.window, base.sessions
    per_client = (clocked.filter(F.col("client").isNotNull())
                  .select("client", "index", "seq", "clock")
                  .repartition("client").sortWithinPartitions("client", "index"))

    def fold_clients(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        schema = _arrow("index long, client binary, sketch binary")
        pack = packer().pack
        for client, rows in _runs(batches, "client", ("index", "seq", "clock")):
            name = key_text(client)
            fold = fold_client(name, base_sessions.get(name), rows, ttl, window)
            skipped = [i for i, _, _ in rows if i not in fold.applied]
            out = {"index": skipped, "client": [None] * len(skipped),
                   "sketch": [None] * len(skipped)}
            if fold.session is not None:
                s = fold.session
                out["index"].append(None)
                out["client"].append(client)
                out["sketch"].append(pack((s.last_seq, s.last_active,
                                           [[q, r] for q, r in s.recorded])))
            yield pa.RecordBatch.from_pydict(out, schema=schema)

    sessions_out = per_client.mapInArrow(fold_clients,
                                         "index long, client binary, sketch binary").cache()
    skipped = sessions_out.filter(F.col("index").isNotNull()).select("index")
    sketches: dict[str, SessionSketch] = {}
    for row in sessions_out.filter(F.col("index").isNull()).collect():
        last_seq, last_active, recorded = msgpack.unpackb(
            row["sketch"], raw=False, unicode_errors="surrogatepass", strict_map_key=False)
        name = key_text(row["client"])
        sketches[name] = SessionSketch(name, last_seq, last_active,
                                       tuple((q, r) for q, r in recorded))
    wanted = frozenset(r for s in sketches.values() for _, r in s.recorded if isinstance(r, int))

    # Keys, per key: the effective commands and the base records of the keys they touch.
    effective = (decodable.join(skipped, "index", "left_anti")
                 .select("key", "index", "op", "value", "prev_index"))
    base_keys = _base_keys(spark, ref, plan) if base.path is not None else None
    if base_keys is not None:
        touched = effective.select("key").distinct()
        base_rows = (base_keys.join(touched, "key", "left_semi")
                     .select("key", F.col("mod").alias("index"), F.lit(BASE).cast("byte")
                             .alias("op"), "value", F.lit(None).cast("long").alias("prev_index")))
        effective = effective.unionByName(base_rows)
    per_key = effective.repartition("key").sortWithinPartitions("key", "index")

    def fold_keys(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        schema = _arrow("key binary, record binary, rindex long, result binary")
        pack = packer().pack
        for raw, rows in _runs(batches, "key", ("index", "op", "value", "prev_index")):
            key = key_text(raw)
            start = None
            ops_of_key = []
            for index, op, value, prev in rows:
                if op == BASE:
                    start = (key, value, index)
                else:
                    ops_of_key.append(Op(index, "put" if op == PUT else "delete"
                                         if op == DELETE else None, key, value or b"", prev))
            final, results = fold_key(key, start, ops_of_key, wanted)
            out = {"key": [raw], "record": [None if final is None else pack(final)],
                   "rindex": [None], "result": [None]}
            for i, result in results.items():
                for col, val in (("key", None), ("record", None), ("rindex", i),
                                 ("result", pack(result))):
                    out[col].append(val)
            yield pa.RecordBatch.from_pydict(out, schema=schema)

    folded = per_key.mapInArrow(fold_keys,
                                "key binary, record binary, rindex long, result binary").cache()
    results = {r["rindex"]: msgpack.unpackb(r["result"], raw=False, strict_map_key=False)
               for r in folded.filter(F.col("rindex").isNotNull()).collect()}
    records = folded.filter(F.col("record").isNotNull()).select("key", "record")
    if base_keys is not None:
        untouched = (base_keys.join(folded.filter(F.col("key").isNotNull()).select("key"),
                                    "key", "left_anti")
                     .select("key", "record"))
        records = records.unionByName(untouched)

    def pack_runs(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        for batch in batches:
            column = batch.column(1).to_pylist()
            yield pa.RecordBatch.from_pydict({"run": [b"".join(column)], "n": [len(column)]},
                                             schema=_arrow("run binary, n long"))

    runs = records.orderBy("key").mapInArrow(pack_runs, "run binary, n long").cache()
    key_count = runs.agg(F.sum("n")).collect()[0][0] or 0

    sessions = [finish_session(s, results) for s in sketches.values()]
    sessions += [s for c, s in base_sessions.items() if c not in sketches]
    normal = commands.agg(F.max("index")).collect()[0][0]
    applied = base.applied_index if normal is None else normal
    store = SnapshotStore(work / "out")

    def write(stream: Any) -> None:
        assemble_payload(stream, applied_index=applied, clock=final_clock, ttl_ms=ttl,
                         window=window, key_count=key_count,
                         key_records=(row["run"] for row in runs.toLocalIterator()),
                         sessions=sessions)

    return store.save(meta, KVStateMachine.kind, write)


def _base_keys(spark: Any, ref: ArchiveRef, plan: RestorePlan) -> Any:
    """The base snapshot's key records, read (and verified) by one task."""
    snap = plan.snapshot
    assert snap is not None
    doc = json.dumps(snap.to_json())

    def read(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        from .source import cluster_archive, key_bytes

        for batch in batches:
            for text in batch.column(0).to_pylist():
                d = json.loads(text)
                record = SnapshotRecord(d["index"], d["term"], d["key"], d["bytes"],
                                        d["sha256"])
                with tempfile.TemporaryDirectory() as tmp:
                    path = Path(tmp) / "base.snap"
                    cluster_archive(ref).download_snapshot(record, path)
                    sm = KVStateMachine()
                    with PayloadReader(path) as payload:
                        sm.restore(payload)
                pack = packer().pack
                schema = _arrow("key binary, value binary, mod long, record binary")
                cols: dict[str, list[Any]] = {"key": [], "value": [], "mod": [], "record": []}
                for entry in sm.records():
                    cols["key"].append(key_bytes(entry[0]))
                    cols["value"].append(entry[1])
                    cols["mod"].append(entry[2])
                    cols["record"].append(pack(entry))
                    if len(cols["key"]) == 65536:
                        yield pa.RecordBatch.from_pydict(cols, schema=schema)
                        cols = {name: [] for name in cols}
                yield pa.RecordBatch.from_pydict(cols, schema=schema)

    frame = spark.createDataFrame([(doc,)], "snapshot string")
    return frame.mapInArrow(read, "key binary, value binary, mod long, record binary").cache()


def _runs(batches: Iterator[Any], by: str, columns: tuple[str, ...]
          ) -> Iterator[tuple[bytes, list[tuple[Any, ...]]]]:
    """Consecutive rows with the same `by` value (the partition is sorted by it), across batch
    boundaries: (value, [row tuples of `columns`])."""
    current: bytes | None = None
    rows: list[tuple[Any, ...]] = []
    for batch in batches:
        keys = batch.column(batch.schema.get_field_index(by)).to_pylist()
        cols = [batch.column(batch.schema.get_field_index(c)).to_pylist() for c in columns]
        for n, key in enumerate(keys):
            if key != current:
                if current is not None:
                    yield current, rows
                current, rows = key, []
            rows.append(tuple(col[n] for col in cols))
    if current is not None:
        yield current, rows
