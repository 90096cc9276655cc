"""Archived entries into Spark, without Hadoop's S3 connector.

The driver plans from the manifest; Spark only sees a small table of parts (runs of
consecutive segments), one task each. Each task fetches its segments with the project's own
archive client (one client per Python worker, kept for the worker's life: building a boto3
client costs more than reading a segment), verifies them whole (SHA-256 against the manifest,
every record's CRC, the index range), decodes the key-value commands and hands Spark blobs:
Arrow batches of a few thousand rows, serialized, for the stage and the task that will fold
them (and, for export, the entries themselves, for the task that writes their slice of the
log). Nothing unverified enters Spark.
"""

from __future__ import annotations

import gc
import zlib
from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
from flotilla.node.archive import (
    Archive,
    ClusterArchive,
    ManifestKeys,
    S3Encryption,
    open_archive,
)
from flotilla.node.archive.manifest import SegmentRecord
from flotilla.node.consensus import EntryKind

from .kvfold import OP_DELETE, OP_PUT, Fields, decode_fields, key_bytes, key_text

__all__ = ["DECODED", "ENTRIES", "ENTRY_ROWS", "KEYS", "KEY_ROWS", "SESSIONS", "SESSION_ROWS",
           "TIMED_KEY_ROWS", "ArchiveRef", "Audit", "PartStats", "arrow_schema",
           "decode_segments", "from_blob", "key_bytes", "key_text", "paused_gc", "to_blob"]

PUT, DELETE, BAD = OP_PUT, OP_DELETE, -1

# The decode stage hands Spark a few large rows, not one per entry: each is a `kind` of blob
# for a destination `dest`. Spark only caches and moves them (its row machinery costs more
# than the fold itself when every entry is a row); the work on entries stays in Python, on
# Arrow batches, in the task that owns them.
DECODED = "kind byte, dest int, blob binary"
SESSIONS = 1  # dest: a bucket of clients; blob: an Arrow batch of SESSION_ROWS
KEYS = 2  # dest: a range of keys; blob: an Arrow batch of KEY_ROWS
# A command with a client id: its clock is max(run, the clock before its part), where run is
# the running maximum of the commands' `ts` over the part's decodable commands so far.
SESSION_ROWS = "client binary, index long, seq long, run long, part int"
# What the key stage folds: a command (op OP_PUT or OP_DELETE) or a base entry (OP_BASE,
# index: its mod index).
KEY_ROWS = "key binary, index long, op byte, value binary, prev_index long"
# The same with the term and time of the command's entry (null for a base entry), for the
# changes' rows: only when asked (`Audit`), so that snapshot-at moves no more bytes.
TIMED_KEY_ROWS = f"{KEY_ROWS}, term long, ts_ms long"
ENTRIES = 3  # dest: a slice of indexes (`Audit`); blob: an Arrow batch of ENTRY_ROWS
# Every entry as the log holds it (kind: EntryKind; data: its bytes), with what its command
# decodes to (op OP_PUT or OP_DELETE; null when it is not a normal entry or does not decode).
ENTRY_ROWS = ("index long, term long, ts_ms long, kind byte, data binary, op byte, "
              "key binary, prev_index long, client binary, seq long")
# Rows per blob at most: the JVM keeps a blob in one array, and arrays above half a region of
# its garbage collector (512 KB in a 1 GB heap) are allocated apart and trigger collections.
FLUSH_ENTRIES = 2048


@dataclass(frozen=True, slots=True)
class PartStats:
    """What the driver needs from a part: the running maximum at its end (-1: no decodable
    command), its last normal entry, the term and time of the target if the part holds it,
    and its configuration entries."""

    part: int
    run: int
    last_normal: int | None
    target: tuple[int, int] | None  # (term, ts_ms)
    memberships: tuple[tuple[int, bytes], ...]  # (index, encoded Membership)

    def pack(self) -> bytes:
        return msgpack.packb([self.part, self.run, self.last_normal, self.target,
                              self.memberships])

    @classmethod
    def unpack(cls, data: bytes) -> PartStats:
        part, run, last_normal, target, memberships = msgpack.unpackb(data)
        return cls(part, run, last_normal, None if target is None else tuple(target),
                   tuple((i, d) for i, d in memberships))


@dataclass(frozen=True, slots=True)
class Audit:
    """What export asks of the decode stage besides the folds' rows: key rows carry their
    entry's term and time (TIMED_KEY_ROWS), and every entry above `since` goes out as
    ENTRY_ROWS to the slice of its index (dest `slice_of(index)`)."""

    since: int
    slice_entries: int  # indexes per slice
    first_slice: int = 0  # the slice numbered dest 0

    def slice_of(self, index: int) -> int:
        return (index - 1) // self.slice_entries - self.first_slice


def to_blob(batch: Any) -> bytes:
    return batch.serialize().to_pybytes()


def from_blob(blob: bytes, schema: Any) -> Any:
    import pyarrow as pa

    return pa.ipc.read_record_batch(pa.py_buffer(blob), schema)


@dataclass(frozen=True, slots=True)
class ArchiveRef:
    """What a task needs to open the archive: plain values, pickled into every task.

    `keys` (`--archive-signing-key-file`) stay with the driver: only the driver reads and
    writes manifests, and tasks fetch objects by the digests of a manifest it verified, so a
    pickled ref leaves the secret out."""

    url: str
    cluster_id: str
    s3_endpoint: str | None = None
    s3_region: str | None = None
    encryption: S3Encryption | None = None
    keys: ManifestKeys | None = field(default=None, repr=False, compare=False)

    def __reduce__(self) -> tuple[Any, ...]:
        return ArchiveRef, (self.url, self.cluster_id, self.s3_endpoint, self.s3_region,
                            self.encryption)

    def open(self) -> Archive:
        return open_archive(self.url, endpoint=self.s3_endpoint, region=self.s3_region,
                            encryption=self.encryption)

    def cluster(self, archive: Archive, cluster_id: str | None = None) -> ClusterArchive:
        """Cluster `cluster_id` (default: this ref's) of `archive`, with this ref's keys."""
        return ClusterArchive(archive, cluster_id or self.cluster_id, keys=self.keys)


_clients: dict[ArchiveRef, ClusterArchive] = {}


def cluster_archive(ref: ArchiveRef) -> ClusterArchive:
    """This worker's client for `ref`, built once."""
    found = _clients.get(ref)
    if found is None:
        found = _clients[ref] = ref.cluster(ref.open())
    return found


def paused_gc(batches: Iterator[Any]) -> Iterator[Any]:
    """`batches` with the cyclic collector paused while each is made: a task makes millions
    of short-lived objects that hold no cycles, and the collector's passes over them cost more
    than the work (as `KVStateMachine.restore` found)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield from batches
    finally:
        if enabled:
            gc.enable()


def decode_segments(ref: ArchiveRef, upto: int, segments: Sequence[SegmentRecord],
                    report: Callable[[PartStats], None], above: int = 0, part: int = 0,
                    buckets: int = 1, bounds: Sequence[bytes] = (),
                    audit: Audit | None = None) -> Iterator[Any]:
    """The entries above index `above` and up to `upto` of `segments` (consecutive, possibly
    overlapping: an index is taken once), decoded, as Arrow batches of DECODED: session rows
    in `buckets` buckets of clients, key rows in the ranges `bounds` cut (range r holds the
    keys k with bounds[r - 1] <= k < bounds[r]), and with `audit` the entries' rows too. The
    part's stats go to `report` at the end."""
    import pyarrow as pa

    session_schema = arrow_schema(SESSION_ROWS)
    key_schema = arrow_schema(KEY_ROWS if audit is None else TIMED_KEY_ROWS)
    entry_schema = arrow_schema(ENTRY_ROWS)
    decoded = arrow_schema(DECODED)
    archive = cluster_archive(ref)
    normal, membership = int(EntryKind.NORMAL), int(EntryKind.MEMBERSHIP)
    last, run = above, -1
    last_normal: int | None = None
    target: tuple[int, int] | None = None
    memberships: list[tuple[int, bytes]] = []
    ranges: list[list[list[Any]]] = [[[] for _ in key_schema] for _ in range(len(bounds) + 1)]
    sessions: list[list[list[Any]]] = [[[] for _ in range(4)] for _ in range(buckets)]
    logged: dict[int, list[list[Any]]] = {}  # by slice
    since = audit.since if audit is not None else upto
    timed = audit is not None
    parts = [part]

    def flush() -> Any:
        kinds, dests, blobs = [], [], []
        for kind, schema, groups in ((KEYS, key_schema, enumerate(ranges)),
                                     (SESSIONS, session_schema, enumerate(sessions)),
                                     (ENTRIES, entry_schema, logged.items())):
            for dest, columns in groups:
                if not columns[0]:
                    continue
                arrays = [pa.array(c, type=f.type) for c, f in zip(columns, schema,
                                                                   strict=False)]
                if kind == SESSIONS:
                    arrays.append(pa.array(parts * len(columns[0]), pa.int32()))
                kinds.append(kind)
                dests.append(dest)
                blobs.append(to_blob(pa.RecordBatch.from_arrays(arrays, schema=schema)))
                for column in columns:
                    column.clear()
        return pa.RecordBatch.from_arrays(
            [pa.array(kinds, pa.int8()), pa.array(dests, pa.int32()),
             pa.array(blobs, pa.binary())], schema=decoded)

    def log(entry: Any, fields: Fields | None) -> None:
        dest = audit.slice_of(entry.index)  # type: ignore[union-attr]
        columns = logged.get(dest)
        if columns is None:
            columns = logged[dest] = [[] for _ in entry_schema]
        for column, value in zip(columns, (entry.index, entry.term, entry.ts_ms, entry.kind,
                                           entry.data), strict=False):
            column.append(value)
        if fields is None:
            for column in columns[5:]:
                column.append(None)
        else:
            code, key, _, prev, client, seq, _ = fields
            for column, value in zip(columns[5:], (code, key, prev, client, seq), strict=True):
                column.append(value)

    pending = 0
    for record in segments:
        if record.last <= last:
            continue
        for entry in archive.read_segment(record):
            i = entry.index
            if i <= last:
                continue
            if i > upto:
                break
            last = i
            if i == upto:
                target = (entry.term, entry.ts_ms)
            if entry.kind != normal:
                if entry.kind == membership:
                    memberships.append((i, entry.data))
                if i > since:
                    log(entry, None)
                    pending += 1
                continue
            last_normal = i
            fields = decode_fields(entry.data)
            if i > since:
                log(entry, fields)
                pending += 1
            if fields is None:
                continue
            code, key, value, prev, client, seq, ts = fields
            columns = ranges[bisect_right(bounds, key)]
            columns[0].append(key)
            columns[1].append(i)
            columns[2].append(code)
            columns[3].append(value)
            columns[4].append(prev)
            if timed:
                columns[5].append(entry.term)
                columns[6].append(entry.ts_ms)
            if ts > run:
                run = ts
            if client is not None:
                columns = sessions[zlib.crc32(client) % buckets]  # stable across processes
                columns[0].append(client)
                columns[1].append(i)
                columns[2].append(seq)
                columns[3].append(run)
            pending += 1
            if pending >= FLUSH_ENTRIES:
                yield flush()
                pending = 0
        if last >= upto:
            break
    yield flush()
    report(PartStats(part, run, last_normal, target, tuple(memberships)))


def arrow_schema(ddl: str) -> Any:
    """The Arrow schema of a Spark DDL string of the types the pipeline uses."""
    import pyarrow as pa

    types = {"long": pa.int64(), "int": pa.int32(), "byte": pa.int8(), "binary": pa.binary(),
             "string": pa.string(), "boolean": pa.bool_()}
    return pa.schema([(name, types[kind]) for name, kind in
                      (part.split() for part in ddl.split(", "))])
