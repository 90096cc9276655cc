"""`flotilla pipeline snapshot-at`: the exact state at an index, synthesized with Spark and
published into the archive as a new cluster that an unchanged member restores.

The driver plans from the manifest (the plan the node's own restore makes: the newest intact
snapshot at or below N plus the segments covering the rest), reads the base snapshot's header
and sessions, samples the keys, and writes the snapshot file; Spark does the work in between,
in the steps of `kvfold`:

    decode   a task per run of consecutive segments (a part): verify, decode, the clock's
             running maximum; commands cut by bucket of clients and by range of keys
             (kept as a local checkpoint; the parts' stats come back in an accumulator)
    sessions per bucket of clients: the indexes answered from a session, the sessions' sketches
    keys     per range of keys, with the base snapshot's entries of that range (read by tasks):
             the final records and the results the sessions record
    payload  the driver takes the ranges in order: they are the payload's key order

Spark moves blobs (Arrow batches of a few thousand rows, serialized), never a row per entry:
its row machinery (caching, shuffling, converting every row) cost more than the fold itself.
A blob reaches the task of its bucket or range by hash partitioning on a label Spark's hash
sends there (`_exactly`). Keys travel as UTF-8 bytes (lone surrogates kept), so a byte sort is
the machine's code-point order.
"""

from __future__ import annotations

import json
import tempfile
from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from contextlib import contextmanager
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
    decode_fields,
    finish_session,
    fold_clients,
    fold_keys,
    key_bytes,
)
from .replay import replay_snapshot
from .source import (
    DECODED,
    FLUSH_ENTRIES,
    KEY_ROWS,
    KEYS,
    SESSION_ROWS,
    SESSIONS,
    ArchiveRef,
    PartStats,
    arrow_schema,
    cluster_archive,
    decode_segments,
    from_blob,
    key_text,
    paused_gc,
    to_blob,
)
from .spark import PipelineError

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
        with tempfile.TemporaryDirectory(prefix="flotilla-snapshot-at-") as work:
            if job.folds:
                path, meta = state_at(spark, ref, plan, Path(work), tasks)
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


def state_at(spark: Any, ref: ArchiveRef, plan: RestorePlan, work: Path,
             tasks: int | None = None) -> tuple[Path, SnapshotMeta]:
    """The key-value machine's snapshot at `plan.index`, folded by Spark into a file under
    `work`, and its metadata (`compact` takes its cleanable point's snapshot from here)."""
    base_meta, base = _read_base(cluster_archive(ref), plan, work)
    ops = _ops(spark, ref, plan, tasks, base)
    meta = _meta_at(ops, plan, base_meta)
    return _synthesize(spark, ref, plan, ops, meta, base, work), meta


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
    sample: tuple[bytes, ...] = ()  # every len(sample)-th key, for the key stage's ranges


BASE_SAMPLE = 4096  # keys of the base snapshot sampled for the key stage's ranges


def _read_base(cluster: ClusterArchive, plan: RestorePlan,
               work: Path) -> tuple[SnapshotMeta | None, _Base]:
    """The base snapshot's header, sessions and a sample of its keys. Its key records are
    skipped, not decoded: tasks read them (`_base_keys`), so the driver never holds them."""
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
            step = max(1, header["keys"] // BASE_SAMPLE)
            sample = []
            for n in range(header["keys"]):
                if n % step:
                    unpacker.skip()
                else:
                    sample.append(key_bytes(next(unpacker)[0]))
            sessions: dict[str, Session] = {}
            for _ in range(header["sessions"]):
                client, last_seq, last_active, results = next(unpacker)
                sessions[client] = Session(client, last_seq, last_active,
                                           tuple(map(tuple, results)))
            payload.finish()
        except (StopIteration, ValueError, TypeError, msgpack.UnpackException) as exc:
            raise PipelineError(f"{name} is not a readable key-value snapshot: {exc}") from None
    return meta, _Base(header["applied_index"], header["clock"], header["session_ttl_ms"],
                       header["session_window"], sessions, path, header["keys"], tuple(sample))


def _payload_header(header: Any, name: str) -> dict[str, Any]:
    if not isinstance(header, dict) or header.get("version") != 1 or not all(
            type(header.get(f)) is int for f in ("applied_index", "clock", "session_ttl_ms",
                                                  "session_window", "keys", "sessions")):
        raise PipelineError(f"{name} is not a version 1 key-value snapshot")
    return header


def _ops(spark: Any, ref: ArchiveRef, plan: RestorePlan, tasks: int | None,
         base: _Base) -> _Decoded:
    """Every entry after the base up to the target, decoded by a few large tasks, each taking
    a run of consecutive segments (a part) so that it can keep the clock's running maximum,
    and handing over its rows already cut for the stages that follow: commands with a client
    id by bucket of clients, every command by range of keys.

    The output is kept as a local checkpoint on the executors' disks: Spark stores the rows
    as they are, where a DataFrame cache builds column batches first (a quarter more of the
    JVM's CPU over the job on 3M entries, most of it in this stage). The price: an
    executor lost before the job ends takes its part with it and the job fails, where a cache
    would decode the part again. The job is then rerun as a whole; it gives the same result."""
    sc = spark.sparkContext
    parallel = tasks or sc.defaultParallelism
    buckets = sc.defaultParallelism  # the session stage's partitions
    bounds = _key_bounds(ref, plan, base, KEY_RANGES_PER_CORE * sc.defaultParallelism)
    docs = []
    above = plan.base_index
    for chunk in _consecutive(list(plan.segments), parallel):
        docs.append(json.dumps({"above": above, "segments": [s.to_json() for s in chunk]}))
        above = max(above, chunk[-1].last)
    if not docs:
        return _Decoded(spark.createDataFrame([], DECODED), bounds, buckets, [])
    upto = plan.index
    # The parts' stats come back with the tasks' results (keyed by part: a task run twice
    # reports the same), so no job reads the decoded rows for them.
    reported = sc.accumulator({}, _ByPart())

    def decode_parts(batches: Iterator[Any]) -> Iterator[Any]:
        from flotilla.node.archive.manifest import SegmentRecord

        def report(stats: PartStats) -> None:
            reported.add({stats.part: stats.pack()})

        for batch in batches:
            for part in batch.column(0).to_pylist():
                doc = json.loads(docs[part])
                records = [SegmentRecord(d["first"], d["last"], d["key"], d["bytes"],
                                         d["sha256"]) for d in doc["segments"]]
                yield from paused_gc(decode_segments(ref, upto, records, report, doc["above"],
                                                     part, buckets, bounds))

    from pyspark import StorageLevel

    parts = spark.range(len(docs), numPartitions=len(docs))
    with _stage(spark, "decode"):  # runs the stage
        frame = parts.mapInArrow(decode_parts, DECODED).localCheckpoint(
            eager=True, storageLevel=StorageLevel.DISK_ONLY)
    stats = [PartStats.unpack(blob) for _, blob in sorted(reported.value.items())]
    if len(stats) != len(docs):
        raise PipelineError(f"{len(docs) - len(stats)} of the {len(docs)} decode tasks "
                            "reported nothing")
    return _Decoded(frame, bounds, buckets, stats)


class _ByPart:
    """An accumulator of {part: packed stats} (Spark's AccumulatorParam protocol; not a
    subclass, so that this module imports without PySpark)."""

    def zero(self, value: dict[int, bytes]) -> dict[int, bytes]:
        return {}

    def addInPlace(self, found: dict[int, bytes], more: dict[int, bytes]) -> dict[int, bytes]:
        found.update(more)
        return found


@dataclass(frozen=True, slots=True)
class _Decoded:
    """The decode stage's output (rows of source.DECODED, checkpointed), how it was cut, and
    what each part reported."""

    frame: Any
    bounds: list[bytes]  # the key ranges: range r holds bounds[r - 1] <= key < bounds[r]
    buckets: int  # the buckets of clients
    stats: list[PartStats]  # by part


KEY_RANGES_PER_CORE = 2  # smaller ranges even out the work of the key stage's tasks
SAMPLE_SEGMENTS = 4  # segments the driver reads to sample the keys the log writes


def _key_bounds(ref: ArchiveRef, plan: RestorePlan, base: _Base, ranges: int) -> list[bytes]:
    """Keys that cut the key stage's rows (the commands and the base entries) into `ranges`
    ranges of about as many rows, from a sample: the keys of a few segments spread over the
    plan (read here, on the driver) and the base snapshot's sample."""
    segments = list(plan.segments)
    picked = sorted({segments[n * (len(segments) - 1) // max(1, SAMPLE_SEGMENTS - 1)]
                     for n in range(SAMPLE_SEGMENTS)}, key=lambda s: s.first) if segments else []
    logged: list[bytes] = []
    for segment in picked:
        for entry in cluster_archive(ref).read_segment(segment):
            if (entry.kind == EntryKind.NORMAL and plan.base_index < entry.index <= plan.index
                    and (fields := decode_fields(entry.data)) is not None):
                logged.append(fields[1])
    entries = plan.index - plan.base_index
    samples = [(key, entries / len(logged)) for key in logged]
    if base.sample:
        samples += [(key, base.keys / len(base.sample)) for key in base.sample]
    samples.sort()
    total = sum(weight for _, weight in samples)
    bounds: list[bytes] = []
    done = 0.0
    for key, weight in samples:
        if len(bounds) + 1 >= ranges:
            break
        if done >= total * (len(bounds) + 1) / ranges and (not bounds or key > bounds[-1]):
            bounds.append(key)
        done += weight
    return bounds


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


def _meta_at(ops: _Decoded, plan: RestorePlan, base_meta: SnapshotMeta | None) -> SnapshotMeta:
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


def _synthesize(spark: Any, ref: ArchiveRef, plan: RestorePlan, ops: _Decoded,
                meta: SnapshotMeta, base: _Base, work: Path) -> Path:
    with _unchecked_shuffles(spark):
        return _fold(spark, ref, plan, ops, meta, base, work)


@contextmanager
def _stage(spark: Any, name: str) -> Iterator[None]:
    """The Spark jobs run inside are described as this stage of snapshot-at (in Spark's UI,
    and its status store, where bench/pipeline_bench.py reads the stages' times)."""
    spark.sparkContext.setJobDescription(f"snapshot-at: {name}")
    try:
        yield
    finally:
        spark.sparkContext.setJobDescription(None)


@contextmanager
def _unchecked_shuffles(spark: Any) -> Iterator[None]:
    """Spark 4.1 and later hash every shuffled row (an order-independent checksum) to notice
    a retried task that writes other data than its first attempt, and then retry the whole
    consumer stage. These stages shuffle blobs that a retry rebuilds byte for byte (the
    decode of the same segments, the same folds), so the check only costs: hashing the
    blobs took a sixth of the JVM's CPU. Either setting turns the hashing on."""
    keys = ("spark.sql.shuffle.orderIndependentChecksum.enabled",
            "spark.sql.shuffle.orderIndependentChecksum.enableFullRetryOnMismatch")
    before = {key: spark.conf.get(key, None) for key in keys}  # None: not set
    for key in keys:
        spark.conf.set(key, "false")
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


def _fold(spark: Any, ref: ArchiveRef, plan: RestorePlan, ops: _Decoded, meta: SnapshotMeta,
          base: _Base, work: Path) -> Path:
    """The sessions stage, then the keys stage, then the payload. Spark moves the decode
    stage's blobs to the task of their bucket or range; the tasks fold them."""
    from pyspark.sql import functions as F

    sc = spark.sparkContext
    decoded, bounds = ops.frame, ops.bounds

    # The clock: each part's running maximum, and a prefix over the parts on the driver.
    stats = ops.stats
    starts: list[int] = []
    clock = base.clock
    for s in stats:
        starts.extend([clock] * (s.part + 1 - len(starts)))
        clock = max(clock, s.run)
    final_clock = clock
    last_normal = max((s.last_normal for s in stats if s.last_normal is not None), default=None)
    applied = base.applied_index if last_normal is None else last_normal

    # Sessions, per client: the indexes answered from a session, and each session's sketch.
    ttl, window, base_sessions = base.ttl_ms, base.window, base.sessions

    def fold_sessions(batches: Iterator[Any]) -> Iterator[Any]:
        import numpy as np
        import pyarrow as pa

        schema = arrow_schema(SESSION_ROWS)
        found = [from_blob(blob, schema) for batch in batches
                 for blob in batch.column(1).to_pylist()]
        if not found:
            return
        table = pa.Table.from_batches(found, schema).sort_by(
            [("client", "ascending"), ("index", "ascending")])
        before = np.array(starts or [0], dtype=np.int64)

        def rows() -> Iterator[tuple[bytes, int, int, int]]:
            for batch in table.to_batches(65536):
                clocks = np.maximum(batch.column(3).to_numpy(),
                                    before[batch.column(4).to_numpy()])
                yield from zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(),
                               batch.column(2).to_pylist(), clocks.tolist(), strict=True)

        pack = packer().pack
        skipped: list[int] = []
        clients: list[bytes] = []
        sketches: list[bytes] = []
        for name, fold in fold_clients(rows(), base_sessions, ttl, window):
            skipped.extend(fold.skipped)
            if fold.session is not None:
                s = fold.session
                clients.append(key_bytes(name))
                sketches.append(pack((s.last_seq, s.last_active, s.recorded)))
        clients.append(b"")  # the skipped indexes, as int64s
        sketches.append(np.array(skipped, dtype=np.int64).tobytes())
        yield pa.RecordBatch.from_arrays([pa.array(clients, pa.binary()),
                                          pa.array(sketches, pa.binary())],
                                         names=["client", "blob"])

    per_client = _exactly(decoded.filter(F.col("kind") == SESSIONS).select("dest", "blob"),
                          ops.buckets)
    sketches: dict[str, SessionSketch] = {}
    skipped_parts = []
    with _stage(spark, "sessions"):
        found = per_client.mapInArrow(lambda batches: paused_gc(fold_sessions(batches)),
                                      "client binary, blob binary").collect()
    for client, blob in found:
        if not client:
            skipped_parts.append(blob)
            continue
        last_seq, last_active, recorded = msgpack.unpackb(
            blob, raw=False, unicode_errors="surrogatepass", strict_map_key=False)
        name = key_text(client)
        sketches[name] = SessionSketch(name, last_seq, last_active,
                                       tuple((q, r) for q, r in recorded))
    wanted = frozenset(r for s in sketches.values() for _, r in s.recorded if isinstance(r, int))
    skipped = sc.broadcast(b"".join(skipped_parts))

    # Keys, per range of keys: the commands not answered from a session and every base
    # entry. Range partitioning keeps the ranges in order: the partitions in order are the
    # payload's.
    per_key = decoded.filter(F.col("kind") == KEYS).select("dest", "blob")
    if base.path is not None:
        per_key = per_key.unionByName(
            _base_keys(spark, ref, plan, base.keys, sc.defaultParallelism, bounds))
    per_key = _exactly(per_key, len(bounds) + 1)

    def fold_ranges(batches: Iterator[Any]) -> Iterator[Any]:
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc
        from pyspark import TaskContext

        schema = arrow_schema(KEY_ROWS)
        out = arrow_schema(_FOLDED)
        by_range: dict[int, list[Any]] = {}
        for batch in batches:
            for dest, blob in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(),
                                  strict=True):
                batch = from_blob(blob, schema)
                by_range.setdefault(dest, []).append((batch.column(1)[0].as_py(), batch))
        partition = TaskContext.get().partitionId()
        if any(dest != partition for dest in by_range):  # the payload's order depends on it
            raise RuntimeError(f"Spark put key ranges {sorted(by_range)} in partition "
                               f"{partition}: the payload would be out of order")
        gone = pa.array(np.frombuffer(skipped.value, dtype=np.int64))
        pack = packer().pack
        for dest in sorted(by_range):
            # Each blob holds ascending indexes, and blobs hold disjoint ranges of them (a base
            # entry's mod index is below every command's): in order of their first index,
            # the rows are in index order, and a stable sort by key alone puts them in
            # (key, index) order.
            found = sorted(by_range.pop(dest), key=lambda pair: pair[0])
            table = pa.Table.from_batches([batch for _, batch in found], schema)
            if len(gone):
                table = table.filter(pc.invert(pc.is_in(table["index"], value_set=gone)))
            # Arrow's sort is stable and orders binary as unsigned bytes: the code-point
            # order of UTF-8 keys.
            table = table.take(pc.sort_indices(table["key"]))

            def rows(table: Any = table) -> Iterator[tuple[Any, ...]]:
                for batch in table.to_batches(65536):
                    yield from zip(*(column.to_pylist() for column in batch.columns),
                                   strict=True)

            results: dict[int, dict[str, Any]] = {}
            run: list[bytes] = []
            for record in fold_keys(rows(), wanted, results):
                run.append(record)
                if len(run) == FLUSH_ENTRIES:
                    yield _folded_batch(out, dest, run, {})
                    run = []
            yield _folded_batch(out, dest, run, {i: pack(r) for i, r in results.items()})

    folded = per_key.mapInArrow(lambda batches: paused_gc(fold_ranges(batches)),
                                _FOLDED).cache()
    try:
        results: dict[int, dict[str, Any]] = {}
        key_count = 0
        with _stage(spark, "keys"):
            found = folded.select("n", "rindex", "result").collect()
        for n, index, result in found:
            if index is None:
                key_count += n
            else:
                results[index] = msgpack.unpackb(result, raw=False, strict_map_key=False)
        sessions = [finish_session(s, results) for s in sketches.values()]
        sessions += [s for c, s in base_sessions.items() if c not in sketches]
        runs = folded.filter(F.col("run").isNotNull()).select("dest", "run")

        def key_records() -> Iterator[bytes]:
            """The runs in range order, a few ranges at a time, through Arrow: collect() and
            toLocalIterator() send binary through a pickler that turns every byte array into
            a latin-1 string (a sixth of the JVM's CPU on 3M entries)."""
            for low in range(0, len(bounds) + 1, RANGES_PER_FETCH):
                some = runs.filter(F.col("dest").between(low, low + RANGES_PER_FETCH - 1))
                yield from some.toArrow().column("run").to_pylist()

        def write(stream: Any) -> None:
            assemble_payload(stream, applied_index=applied, clock=final_clock, ttl_ms=ttl,
                             window=window, key_count=key_count, key_records=key_records(),
                             sessions=sessions)

        with _stage(spark, "payload"):
            return SnapshotStore(work / "out").save(meta, KVStateMachine.kind, write)
    finally:
        folded.unpersist()
        _release(decoded)  # the last stage to read it
        skipped.unpersist()


def _release(checkpointed: Any) -> None:
    """Drop a local checkpoint's blocks now (DataFrame.unpersist does not reach them; Spark
    would only drop them once the driver's JVM collected the DataFrame)."""
    plan = checkpointed._jdf.queryExecution().analyzed()
    if plan.getClass().getSimpleName() == "LogicalRDD":
        plan.rdd().unpersist(False)


_FOLDED = "dest int, run binary, n long, rindex long, result binary"
RANGES_PER_FETCH = 8  # key ranges the driver fetches at a time while it writes the payload


def _exactly(frame: Any, count: int) -> Any:
    """`frame` (with a `dest` column, 0 <= dest < count) in `count` partitions, the rows of
    destination d in partition d: one shuffle, and no job to sample the data as range
    partitioning would run. Spark puts a row of `repartition(count, c)` in partition
    pmod(hash(c), count), `hash` being its Murmur3 (the SQL function, which bucketed tables
    depend on, so it stays put); each destination travels as a label that hashes to it. The
    key stage's tasks check where their ranges landed."""
    from pyspark.sql import functions as F

    labels = F.array(*(F.lit(label) for label in _labels(count)))
    return frame.repartition(count, F.element_at(labels, F.col("dest") + 1))


def _labels(count: int) -> list[int]:
    """For each partition of `count`, the smallest int that Spark's hash sends there."""
    found: dict[int, int] = {}
    label = 0
    while len(found) < count:
        found.setdefault(spark_hash_int(label) % count, label)
        label += 1
    return [found[p] for p in range(count)]


def spark_hash_int(value: int, seed: int = 42) -> int:
    """Spark's `hash` of one int column: Murmur3 x86 32-bit of its 4 bytes (tested against
    Spark in tests/pipeline/test_snapshot_at.py)."""

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & 0xFFFFFFFF

    k1 = rotl((value & 0xFFFFFFFF) * 0xCC9E2D51 & 0xFFFFFFFF, 15) * 0x1B873593 & 0xFFFFFFFF
    h1 = (rotl(seed ^ k1, 13) * 5 + 0xE6546B64) & 0xFFFFFFFF
    h1 ^= 4
    h1 = (h1 ^ (h1 >> 16)) * 0x85EBCA6B & 0xFFFFFFFF
    h1 = (h1 ^ (h1 >> 13)) * 0xC2B2AE35 & 0xFFFFFFFF
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 >= 1 << 31 else h1


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


def _base_keys(spark: Any, ref: ArchiveRef, plan: RestorePlan, count: int, parts: int,
               bounds: list[bytes]) -> Any:
    """The base snapshot's key records as blobs of KEY_ROWS (index: the key's mod index) for
    their key ranges, read by `parts` tasks: each verifies the whole object and decodes its
    share, which is in key order, so it is cut at the bounds without a sort."""
    snap = plan.snapshot
    assert snap is not None
    doc = json.dumps(snap.to_json())
    shares = [count * n // parts for n in range(parts + 1)]

    def read(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        d = json.loads(doc)
        record = SnapshotRecord(d["index"], d["term"], d["key"], d["bytes"], d["sha256"])
        schema = arrow_schema(KEY_ROWS)

        def blobs(keys: list[bytes], values: list[bytes], mods: list[int]) -> Any:
            dests, out = [], []
            start = 0
            for dest in range(bisect_right(bounds, keys[0]), len(bounds) + 1):
                end = len(keys) if dest == len(bounds) else bisect_left(keys, bounds[dest])
                if end > start:
                    dests.append(dest)
                    out.append(to_blob(pa.RecordBatch.from_arrays(
                        [pa.array(keys[start:end], pa.binary()),
                         pa.array(mods[start:end], pa.int64()),
                         pa.array([OP_BASE] * (end - start), pa.int8()),
                         pa.array(values[start:end], pa.binary()),
                         pa.nulls(end - start, pa.int64())], schema=schema)))
                start = end
                if start == len(keys):
                    break
            return pa.RecordBatch.from_arrays([pa.array(dests, pa.int32()),
                                               pa.array(out, pa.binary())],
                                              names=["dest", "blob"])

        for batch in batches:
            for part in batch.column(0).to_pylist():
                low, high = shares[part], shares[part + 1]
                if low == high:
                    continue
                with tempfile.TemporaryDirectory() as tmp:
                    path = Path(tmp) / "base.snap"
                    cluster_archive(ref).download_snapshot(record, path)
                    with PayloadReader(path) as payload:
                        unpacker = msgpack.Unpacker(payload, raw=False, use_list=False,
                                                    unicode_errors="surrogatepass")
                        next(unpacker)
                        for _ in range(low):
                            unpacker.skip()
                        for start in range(low, high, FLUSH_ENTRIES):
                            keys, values, mods = [], [], []
                            for key, value, mod in islice(unpacker,
                                                          min(FLUSH_ENTRIES, high - start)):
                                keys.append(key_bytes(key))
                                values.append(value)
                                mods.append(mod)
                            yield blobs(keys, values, mods)

    frame = spark.range(parts, numPartitions=parts)
    return frame.mapInArrow(lambda batches: paused_gc(read(batches)), "dest int, blob binary")
