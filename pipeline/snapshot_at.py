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
from itertools import islice
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

from .kvfold import (
    OP_BASE,
    SessionSketch,
    assemble_payload,
    finish_session,
    fold_clients,
    fold_keys,
    key_bytes,
)
from .replay import replay_snapshot
from .source import (
    BAD,
    OPS_SCHEMA,
    ArchiveRef,
    arrow_schema,
    decode_segments,
    key_text,
    paused_gc,
)
from .spark import PipelineError

__all__ = ["SnapshotAtResult", "plan_snapshot_at", "snapshot_at"]



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
        cluster_id = resolve_cluster_id(archive, ref.cluster_id, id_flag="--cluster-id",
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
    """The base snapshot as the driver needs it: all but its key records (read by tasks)."""

    applied_index: int
    clock: int
    ttl_ms: int
    window: int
    sessions: dict[str, Session]
    path: Path | None
    keys: int = 0  # how many key records it holds


def _read_base(cluster: ClusterArchive, plan: RestorePlan,
               work: Path) -> tuple[SnapshotMeta | None, _Base]:
    """The base snapshot's header and sessions. Its key records are skipped, not decoded:
    tasks read them (`_base_keys`), so the driver never holds the keys."""
    if plan.snapshot is None:
        empty = KVStateMachine()
        return None, _Base(0, 0, empty.session_ttl_ms, empty.session_window, {}, None)
    path = work / "base.snap"
    meta = cluster.download_snapshot(plan.snapshot, path)
    name = cluster.location(plan.snapshot)
    with PayloadReader(path) as payload:
        if payload.kind != KVStateMachine.kind:
            raise PipelineError(f"{name} is a snapshot of the {payload.kind!r} machine, not of "
                                "the key-value machine: pass that machine's --state-machine "
                                "module:Class", 2)
        try:
            unpacker = msgpack.Unpacker(payload, raw=False, use_list=False,
                                        unicode_errors="surrogatepass")
            header = _payload_header(next(unpacker), name)
            for _ in range(header["keys"]):
                unpacker.skip()
            sessions: dict[str, Session] = {}
            for _ in range(header["sessions"]):
                client, last_seq, last_active, results = next(unpacker)
                sessions[client] = Session(client, last_seq, last_active,
                                           tuple(map(tuple, results)))
            payload.finish()
        except (StopIteration, ValueError, TypeError, msgpack.UnpackException) as exc:
            raise PipelineError(f"{name} is not a readable key-value snapshot: {exc}") from None
    return meta, _Base(header["applied_index"], header["clock"], header["session_ttl_ms"],
                       header["session_window"], sessions, path, header["keys"])


def _payload_header(header: Any, name: str) -> dict[str, Any]:
    if not isinstance(header, dict) or header.get("version") != 1 or not all(
            type(header.get(f)) is int for f in ("applied_index", "clock", "session_ttl_ms",
                                                  "session_window", "keys", "sessions")):
        raise PipelineError(f"{name} is not a version 1 key-value snapshot")
    return header


def _ops(spark: Any, ref: ArchiveRef, plan: RestorePlan, tasks: int | None) -> Any:
    """Every entry after the base up to the target, decoded by a few large tasks, each taking
    a run of consecutive segments (a part) so that it can keep the clock's running maximum."""
    parallel = tasks or spark.sparkContext.defaultParallelism
    docs = []
    above = plan.base_index
    for chunk in _consecutive(list(plan.segments), parallel):
        docs.append(json.dumps({"above": above, "segments": [s.to_json() for s in chunk]}))
        above = max(above, chunk[-1].last)
    if not docs:
        return spark.createDataFrame([], OPS_SCHEMA)
    upto = plan.index

    def decode_parts(batches: Iterator[Any]) -> Iterator[Any]:
        from flotilla.node.archive.manifest import SegmentRecord

        for batch in batches:
            for part in batch.column(0).to_pylist():
                doc = json.loads(docs[part])
                records = [SegmentRecord(d["first"], d["last"], d["key"], d["bytes"],
                                         d["sha256"]) for d in doc["segments"]]
                yield from paused_gc(decode_segments(ref, upto, records, doc["above"], part))

    parts = spark.range(len(docs), numPartitions=len(docs))
    return parts.mapInArrow(decode_parts, OPS_SCHEMA).cache()


def _consecutive(segments: list[Any], count: int) -> list[list[Any]]:
    """`segments` cut into at most `count` runs of consecutive segments, of about as many
    entries each."""
    total = sum(s.last - s.first + 1 for s in segments)
    runs: list[list[Any]] = [[]]
    done = 0
    for segment in segments:
        if runs[-1] and done >= total * len(runs) / count:
            runs.append([])
        runs[-1].append(segment)
        done += segment.last - segment.first + 1
    return [run for run in runs if run]


def _meta_at(ops: Any, plan: RestorePlan, base_meta: SnapshotMeta | None) -> SnapshotMeta:
    """Term of the target entry and the configuration in force there (the last membership
    entry at or below it, else the base snapshot's)."""
    from pyspark.sql import functions as F

    index = plan.index
    if index == plan.base_index and base_meta is not None:
        return base_meta
    rows = (ops.filter((F.col("index") == index)
                       | (F.col("kind") == int(EntryKind.MEMBERSHIP)))
            .select("index", "term", "ts_ms", "kind", "data").collect())
    found = [row for row in rows if row["index"] == index]
    if not found:
        raise PipelineError(f"entry {index} is missing from the archived segments")
    changes = sorted((row["index"], row["data"]) for row in rows
                     if row["kind"] == int(EntryKind.MEMBERSHIP))
    if changes:
        membership = Membership.decode(changes[-1][1])
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
    from pyspark.sql import functions as F

    parallel = spark.sparkContext.defaultParallelism
    normal = int(EntryKind.NORMAL)
    cached = [ops]

    # The clock: each part's running maximum, and a prefix over the parts on the driver.
    stats = sorted(ops.groupBy("part").agg(
        F.max("run").alias("run"),
        F.max(F.when(F.col("kind") == normal, F.col("index"))).alias("normal")).collect())
    starts: list[int] = []
    clock = base.clock
    for part, run, _ in stats:
        starts.extend([clock] * (part + 1 - len(starts)))
        clock = max(clock, -1 if run is None else run)
    final_clock = clock
    last_normal = max((row["normal"] for row in stats if row["normal"] is not None),
                      default=None)
    applied = base.applied_index if last_normal is None else last_normal

    # Sessions, per client: the indexes answered from a session, and each session's sketch.
    ttl, window, base_sessions = base.ttl_ms, base.window, base.sessions
    per_client = (ops.filter(F.col("client").isNotNull())
                  .select("client", "index", "seq", "run", "part")
                  .repartition(parallel, "client").sortWithinPartitions("client", "index"))

    def fold_sessions(batches: Iterator[Any]) -> Iterator[Any]:
        import numpy as np
        import pyarrow as pa

        before = np.array(starts or [0], dtype=np.int64)

        def rows() -> Iterator[tuple[bytes, int, int, int]]:
            for batch in batches:
                clocks = np.maximum(batch.column(3).to_numpy(),
                                    before[batch.column(4).to_numpy()])
                yield from zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(),
                               batch.column(2).to_pylist(), clocks.tolist(), strict=True)

        schema = arrow_schema("index long, client binary, sketch binary")
        pack = packer().pack
        skipped: list[int] = []
        names: list[bytes] = []
        sketches: list[bytes] = []
        for name, fold in fold_clients(rows(), base_sessions, ttl, window):
            skipped.extend(fold.skipped)
            if fold.session is not None:
                s = fold.session
                names.append(key_bytes(name))
                sketches.append(pack((s.last_seq, s.last_active, s.recorded)))
        yield pa.RecordBatch.from_arrays(
            [pa.array(skipped + [None] * len(names), pa.int64()),
             pa.array([None] * len(skipped) + names, pa.binary()),
             pa.array([None] * len(skipped) + sketches, pa.binary())], schema=schema)

    sessions_out = per_client.mapInArrow(
        lambda batches: paused_gc(fold_sessions(batches)),
        "index long, client binary, sketch binary").cache()
    cached.append(sessions_out)
    sketches: dict[str, SessionSketch] = {}
    for row in sessions_out.filter(F.col("client").isNotNull()).collect():
        last_seq, last_active, recorded = msgpack.unpackb(
            row["sketch"], raw=False, unicode_errors="surrogatepass", strict_map_key=False)
        name = key_text(row["client"])
        sketches[name] = SessionSketch(name, last_seq, last_active,
                                       tuple((q, r) for q, r in recorded))
    wanted = frozenset(r for s in sketches.values() for _, r in s.recorded if isinstance(r, int))
    skipped = sessions_out.filter(F.col("index").isNotNull()).select("index")

    # Keys, per key: the commands not answered from a session, and every base entry, by
    # ranges of keys so that the partitions in order are the payload's order.
    effective = (ops.filter((F.col("kind") == normal) & (F.col("op") != BAD))
                 .join(F.broadcast(skipped), "index", "left_anti")
                 .select("key", "index", "op", "value", "prev_index"))
    if base.path is not None:
        base_keys = _base_keys(spark, ref, plan, base.keys, parallel)
        cached.append(base_keys)
        effective = effective.unionByName(base_keys)
    per_key = effective.repartitionByRange(parallel, "key").sortWithinPartitions("key", "index")

    def fold_by_key(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        def rows() -> Iterator[tuple[bytes, int, int, bytes | None, int | None]]:
            for batch in batches:
                yield from zip(*(column.to_pylist() for column in batch.columns), strict=True)

        schema = arrow_schema("run binary, n long, rindex long, result binary")
        results: dict[int, dict[str, Any]] = {}
        run: list[bytes] = []
        for record in fold_keys(rows(), wanted, results):
            run.append(record)
            if len(run) == 65536:
                yield pa.RecordBatch.from_arrays(
                    [pa.array([b"".join(run)]), pa.array([len(run)]), pa.nulls(1, pa.int64()),
                     pa.nulls(1, pa.binary())], schema=schema)
                run = []
        pack = packer().pack
        yield pa.RecordBatch.from_arrays(
            [pa.array([b"".join(run)] + [None] * len(results), pa.binary()),
             pa.array([len(run)] + [None] * len(results), pa.int64()),
             pa.array([None, *results], pa.int64()),
             pa.array([None, *map(pack, results.values())], pa.binary())], schema=schema)

    folded = per_key.mapInArrow(lambda batches: paused_gc(fold_by_key(batches)),
                                "run binary, n long, rindex long, result binary").cache()
    cached.append(folded)
    results = {r["rindex"]: msgpack.unpackb(r["result"], raw=False, strict_map_key=False)
               for r in folded.filter(F.col("rindex").isNotNull()).collect()}
    key_count = folded.agg(F.sum("n")).collect()[0][0] or 0

    sessions = [finish_session(s, results) for s in sketches.values()]
    sessions += [s for c, s in base_sessions.items() if c not in sketches]
    store = SnapshotStore(work / "out")
    runs = folded.filter(F.col("run").isNotNull()).select("run")

    def write(stream: Any) -> None:
        assemble_payload(stream, applied_index=applied, clock=final_clock, ttl_ms=ttl,
                         window=window, key_count=key_count,
                         key_records=(row["run"] for row in runs.toLocalIterator()),
                         sessions=sessions)

    try:
        return store.save(meta, KVStateMachine.kind, write)
    finally:
        for frame in cached:  # the last stage to read them
            frame.unpersist()


def _base_keys(spark: Any, ref: ArchiveRef, plan: RestorePlan, count: int, parts: int) -> Any:
    """The base snapshot's key records as key-stage rows (index: the key's mod index), read
    by `parts` tasks: each verifies the whole object and decodes its share of the records."""
    snap = plan.snapshot
    assert snap is not None
    doc = json.dumps(snap.to_json())
    bounds = [count * n // parts for n in range(parts + 1)]

    def read(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        from .source import cluster_archive

        d = json.loads(doc)
        record = SnapshotRecord(d["index"], d["term"], d["key"], d["bytes"], d["sha256"])
        schema = arrow_schema(_KEY_ROWS)
        for batch in batches:
            for part in batch.column(0).to_pylist():
                low, high = bounds[part], bounds[part + 1]
                with tempfile.TemporaryDirectory() as tmp:
                    path = Path(tmp) / "base.snap"
                    cluster_archive(ref).download_snapshot(record, path)
                    with PayloadReader(path) as payload:
                        unpacker = msgpack.Unpacker(payload, raw=False, use_list=False,
                                                    unicode_errors="surrogatepass")
                        next(unpacker)
                        for _ in range(low):
                            unpacker.skip()
                        for start in range(low, high, 65536):
                            keys, values, mods = [], [], []
                            for key, value, mod in islice(unpacker, min(65536, high - start)):
                                keys.append(key_bytes(key))
                                values.append(value)
                                mods.append(mod)
                            yield pa.RecordBatch.from_arrays(
                                [pa.array(keys, pa.binary()), pa.array(mods, pa.int64()),
                                 pa.array([OP_BASE] * len(keys), pa.int8()),
                                 pa.array(values, pa.binary()), pa.nulls(len(keys), pa.int64())],
                                schema=schema)

    frame = spark.range(parts, numPartitions=parts)
    return frame.mapInArrow(lambda batches: paused_gc(read(batches)), _KEY_ROWS).cache()


_KEY_ROWS = "key binary, index long, op byte, value binary, prev_index long"
