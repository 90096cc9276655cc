"""The Spark stages that snapshot-at and export share: the base snapshot read, the decode
stage, the sessions stage, and the key stage's inputs and tables.

    decode   a task per run of consecutive segments (a part): verify, decode, the clock's
             running maximum; commands cut by bucket of clients and by range of keys
             (kept as a local checkpoint; the parts' stats come back in an accumulator);
             for export, the entries themselves too, by slice of indexes
    sessions per bucket of clients: the indexes answered from a session, the sessions' sketches
    keys     per range of keys, with the base snapshot's entries of that range (read by tasks):
             each job folds the range's table its own way (`fold_keys` for snapshot-at's
             records, `fold_changes` for export's change rows)

Spark moves blobs (Arrow batches of a few thousand rows, serialized), never a row per entry:
its row machinery (caching, shuffling, converting every row) cost more than the fold itself.
A blob reaches the task of its bucket or range by hash partitioning on a label Spark's hash
sends there (`exactly`). Keys travel as UTF-8 bytes (lone surrogates kept), so a byte sort is
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
from flotilla.node.archive import ClusterArchive
from flotilla.node.archive.manifest import SnapshotRecord
from flotilla.node.archive.restore import RestorePlan
from flotilla.node.consensus import EntryKind, SnapshotMeta
from flotilla.node.statemachine.kv import KVStateMachine, packer
from flotilla.node.statemachine.sessions import Session
from flotilla.node.storage import PayloadReader

from .kvfold import OP_BASE, SessionSketch, decode_fields, fold_clients, key_bytes
from .source import (
    DECODED,
    FLUSH_ENTRIES,
    KEY_ROWS,
    KEYS,
    SESSION_ROWS,
    SESSIONS,
    TIMED_KEY_ROWS,
    ArchiveRef,
    Audit,
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

__all__ = ["Base", "Decoded", "Sessions", "base_keys", "decode", "describe_plan", "exactly",
           "fold_sessions", "key_inputs", "range_tables", "read_base", "release",
           "spark_hash_int", "stage", "table_rows", "unchecked_shuffles"]


def describe_plan(plan: RestorePlan) -> dict[str, Any]:
    """A plan as --dry-run prints it."""
    snap = plan.snapshot
    return {"index": plan.index,
            "base_snapshot": None if snap is None else {"key": snap.key, "index": snap.index,
                                                        "bytes": snap.size},
            "segments": [{"key": s.key, "first": s.first, "last": s.last, "bytes": s.size}
                         for s in plan.segments],
            "bytes": (snap.size if snap else 0) + sum(s.size for s in plan.segments)}


@dataclass(frozen=True, slots=True)
class Base:
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


def read_base(cluster: ClusterArchive, plan: RestorePlan,
              work: Path) -> tuple[SnapshotMeta | None, Base]:
    """The base snapshot's header, sessions and a sample of its keys. Its key records are
    skipped, not decoded: tasks read them (`base_keys`), so the driver never holds them."""
    if plan.snapshot is None:
        empty = KVStateMachine()
        return None, Base(0, 0, empty.session_ttl_ms, empty.session_window, {}, None)
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
    return meta, Base(header["applied_index"], header["clock"], header["session_ttl_ms"],
                      header["session_window"], sessions, path, header["keys"], tuple(sample))


def _payload_header(header: Any, name: str) -> dict[str, Any]:
    if not isinstance(header, dict) or header.get("version") != 1 or not all(
            type(header.get(f)) is int for f in ("applied_index", "clock", "session_ttl_ms",
                                                  "session_window", "keys", "sessions")):
        raise PipelineError(f"{name} is not a version 1 key-value snapshot")
    return header


def decode(spark: Any, ref: ArchiveRef, plan: RestorePlan, base: Base, *,
           tasks: int | None = None, job: str = "snapshot-at",
           audit: Audit | None = None) -> Decoded:
    """Every entry after the base up to the target, decoded by a few large tasks (`tasks`,
    default one per core), each taking a run of consecutive segments (a part) so that it can
    keep the clock's running maximum, and handing over its rows already cut for the stages
    that follow: commands with a client id by bucket of clients, every command by range of
    keys; with `audit`, timed key rows and the entries by slice of indexes as well.

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
        return Decoded(spark.createDataFrame([], DECODED), bounds, buckets, [])
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
                                                     part, buckets, bounds, audit))

    from pyspark import StorageLevel

    parts = spark.range(len(docs), numPartitions=len(docs))
    with stage(spark, job, "decode"):  # runs the stage
        frame = parts.mapInArrow(decode_parts, DECODED).localCheckpoint(
            eager=True, storageLevel=StorageLevel.DISK_ONLY)
    stats = [PartStats.unpack(blob) for _, blob in sorted(reported.value.items())]
    if len(stats) != len(docs):
        raise PipelineError(f"{len(docs) - len(stats)} of the {len(docs)} decode tasks "
                            "reported nothing")
    return Decoded(frame, bounds, buckets, stats)


class _ByPart:
    """An accumulator of {part: packed stats} (Spark's AccumulatorParam protocol; not a
    subclass, so that this module imports without PySpark)."""

    def zero(self, value: dict[int, bytes]) -> dict[int, bytes]:
        return {}

    def addInPlace(self, found: dict[int, bytes], more: dict[int, bytes]) -> dict[int, bytes]:
        found.update(more)
        return found


@dataclass(frozen=True, slots=True)
class Decoded:
    """The decode stage's output (rows of source.DECODED, checkpointed), how it was cut, and
    what each part reported."""

    frame: Any
    bounds: list[bytes]  # the key ranges: range r holds bounds[r - 1] <= key < bounds[r]
    buckets: int  # the buckets of clients
    stats: list[PartStats]  # by part


KEY_RANGES_PER_CORE = 2  # smaller ranges even out the work of the key stage's tasks


SAMPLE_SEGMENTS = 4  # segments the driver reads to sample the keys the log writes


def _key_bounds(ref: ArchiveRef, plan: RestorePlan, base: Base, ranges: int) -> list[bytes]:
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


@contextmanager
def stage(spark: Any, job: str, name: str) -> Iterator[None]:
    """The Spark jobs run inside are described as this stage of `job` ("snapshot-at: keys",
    in Spark's UI and its status store, where bench/pipeline_bench.py reads the stages'
    times)."""
    spark.sparkContext.setJobDescription(f"{job}: {name}")
    try:
        yield
    finally:
        spark.sparkContext.setJobDescription(None)


@contextmanager
def unchecked_shuffles(spark: Any) -> Iterator[None]:
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


def release(checkpointed: Any) -> None:
    """Drop a local checkpoint's blocks now (DataFrame.unpersist does not reach them; Spark
    would only drop them once the driver's JVM collected the DataFrame)."""
    plan = checkpointed._jdf.queryExecution().analyzed()
    if plan.getClass().getSimpleName() == "LogicalRDD":
        plan.rdd().unpersist(False)


def exactly(frame: Any, count: int) -> Any:
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


def base_keys(spark: Any, ref: ArchiveRef, plan: RestorePlan, count: int, parts: int,
              bounds: list[bytes], timed: bool = False) -> Any:
    """The base snapshot's key records as blobs of KEY_ROWS (TIMED_KEY_ROWS if `timed`, with
    no term or time; index: the key's mod index) for their key ranges, read by `parts` tasks:
    each verifies the whole object and decodes its share, which is in key order, so it is cut
    at the bounds without a sort."""
    snap = plan.snapshot
    assert snap is not None
    doc = json.dumps(snap.to_json())
    shares = [count * n // parts for n in range(parts + 1)]

    def read(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        d = json.loads(doc)
        record = SnapshotRecord(d["index"], d["term"], d["key"], d["bytes"], d["sha256"])
        schema = arrow_schema(TIMED_KEY_ROWS if timed else KEY_ROWS)
        untimed = len(schema) - 4  # the columns the base has no value for: prev_index, ...

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
                         *[pa.nulls(end - start, pa.int64())] * untimed], schema=schema)))
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


@dataclass(frozen=True, slots=True)
class Sessions:
    """The sessions stage's result: each live session's sketch, the indexes answered from a
    session (a broadcast of int64s: the key stage leaves them out) and the clock at the end."""

    sketches: dict[str, SessionSketch]
    skipped: Any  # a Spark broadcast of the skipped indexes, as int64 bytes
    clock: int

    @property
    def wanted(self) -> frozenset[int]:
        """The indexes of the commands whose results the sessions record."""
        return frozenset(r for s in self.sketches.values() for _, r in s.recorded
                         if isinstance(r, int))


def fold_sessions(spark: Any, ops: Decoded, base: Base, job: str = "snapshot-at") -> Sessions:
    """Sessions, per client: the indexes answered from a session, and each session's sketch.
    The clock a command is judged at is its part's running maximum of `ts` and, before it, a
    prefix over the parts (on the driver). Unpersist `skipped` when the key stage is done."""
    from pyspark.sql import functions as F

    starts: list[int] = []
    clock = base.clock
    for s in ops.stats:
        starts.extend([clock] * (s.part + 1 - len(starts)))
        clock = max(clock, s.run)
    ttl, window, base_sessions = base.ttl_ms, base.window, base.sessions

    def fold(batches: Iterator[Any]) -> Iterator[Any]:
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
        for name, client in fold_clients(rows(), base_sessions, ttl, window):
            skipped.extend(client.skipped)
            if client.session is not None:
                s = client.session
                clients.append(key_bytes(name))
                sketches.append(pack((s.last_seq, s.last_active, s.recorded)))
        clients.append(b"")  # the skipped indexes, as int64s
        sketches.append(np.array(skipped, dtype=np.int64).tobytes())
        yield pa.RecordBatch.from_arrays([pa.array(clients, pa.binary()),
                                          pa.array(sketches, pa.binary())],
                                         names=["client", "blob"])

    per_client = exactly(ops.frame.filter(F.col("kind") == SESSIONS).select("dest", "blob"),
                         ops.buckets)
    sketches: dict[str, SessionSketch] = {}
    skipped_parts = []
    with stage(spark, job, "sessions"):
        found = per_client.mapInArrow(lambda batches: paused_gc(fold(batches)),
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
    skipped = spark.sparkContext.broadcast(b"".join(skipped_parts))
    return Sessions(sketches, skipped, clock)


def key_inputs(spark: Any, ref: ArchiveRef, plan: RestorePlan, ops: Decoded, base: Base,
               timed: bool = False) -> Any:
    """The key stage's input: the decoded commands and every base entry, as blobs in one
    partition per range of keys (partition r holds range r: the partitions in order are the
    ranges in key order). `timed`: the blobs are TIMED_KEY_ROWS, as `decode` made them with
    an `Audit`."""
    from pyspark.sql import functions as F

    per_key = ops.frame.filter(F.col("kind") == KEYS).select("dest", "blob")
    if base.path is not None:
        per_key = per_key.unionByName(base_keys(
            spark, ref, plan, base.keys, spark.sparkContext.defaultParallelism, ops.bounds,
            timed))
    return exactly(per_key, len(ops.bounds) + 1)


def range_tables(batches: Iterator[Any], schema: Any, skipped: bytes) -> Iterator[Any]:
    """In a key stage's task: each range's rows (blobs of `schema` from `key_inputs`) as one
    Arrow table in the key fold's order (key, then index), without the commands answered
    from a session (`skipped`: int64 bytes), yielded as (range, table) in range order."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyspark import TaskContext

    by_range: dict[int, list[Any]] = {}
    for batch in batches:
        for dest, blob in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(),
                              strict=True):
            batch = from_blob(blob, schema)
            by_range.setdefault(dest, []).append((batch.column(1)[0].as_py(), batch))
    partition = TaskContext.get().partitionId()
    if any(dest != partition for dest in by_range):  # the payload's order depends on it
        raise RuntimeError(f"Spark put key ranges {sorted(by_range)} in partition "
                           f"{partition}: the ranges would be out of order")
    gone = pa.array(np.frombuffer(skipped, dtype=np.int64))
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
        yield dest, table.take(pc.sort_indices(table["key"]))


def table_rows(table: Any, columns: int | None = None) -> Iterator[tuple[Any, ...]]:
    """The rows of an Arrow table as tuples of Python values (its first `columns` columns)."""
    for batch in table.to_batches(65536):
        yield from zip(*(column.to_pylist() for column in batch.columns[:columns]),
                       strict=True)
