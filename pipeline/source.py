"""Archived entries into Spark, without Hadoop's S3 connector.

The driver plans from the manifest; Spark only sees a small table of segment records, split
into a few large tasks. Each task fetches its segments with the project's own archive client
(one client per Python worker, kept for the worker's life: building a boto3 client costs more
than reading a segment), verifies them whole (SHA-256 against the manifest, every record's
CRC, the index range), decodes the key-value commands and hands Spark Arrow batches. Nothing
unverified enters Spark.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from flotilla.node.archive import ClusterArchive, open_archive
from flotilla.node.archive.manifest import SegmentRecord
from flotilla.node.consensus import EntryKind

from .kvfold import OP_DELETE, OP_PUT, decode_fields, key_bytes, key_text

__all__ = ["OPS_SCHEMA", "ArchiveRef", "decode_segments", "key_bytes", "key_text",
           "paused_gc"]

PUT, DELETE, BAD = OP_PUT, OP_DELETE, -1

# One row per entry: kind is the entry kind; op/key/... only for normal entries (op BAD for a
# command that does not decode); data only for membership entries. ts_ms is the entry's own
# time (its leader's clock at append; 0 when unknown). run is the running maximum of the
# commands' `ts` over the decodable commands of this part so far (null for other entries);
# part numbers the runs of consecutive segments one task decodes, in log order, so the
# machine's clock at a command is max(run, the clock before its part).
OPS_SCHEMA = ("index long, term long, ts_ms long, kind byte, op byte, key binary, "
              "value binary, prev_index long, client binary, seq long, run long, part int, "
              "data binary")


@dataclass(frozen=True, slots=True)
class ArchiveRef:
    """What a task needs to open the archive: plain values, pickled into every task."""

    url: str
    cluster_id: str
    s3_endpoint: str | None = None
    s3_region: str | None = None


_clients: dict[ArchiveRef, ClusterArchive] = {}


def cluster_archive(ref: ArchiveRef) -> ClusterArchive:
    """This worker's client for `ref`, built once."""
    found = _clients.get(ref)
    if found is None:
        archive = open_archive(ref.url, endpoint=ref.s3_endpoint, region=ref.s3_region)
        found = _clients[ref] = ClusterArchive(archive, ref.cluster_id)
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
                    above: int = 0, part: int = 0) -> Iterator[Any]:
    """The entries above index `above` and up to `upto` of `segments` (consecutive, possibly
    overlapping: an index is taken once), as Arrow batches of OPS_SCHEMA, one per segment."""
    import pyarrow as pa

    schema = arrow_schema(OPS_SCHEMA)
    archive = cluster_archive(ref)
    normal, membership = int(EntryKind.NORMAL), int(EntryKind.MEMBERSHIP)
    last, run = above, -1
    for record in segments:
        if record.last <= last:
            continue
        cols: list[list[Any]] = [[] for _ in range(13)]
        (index, term, ts_ms, kind, op, key, value, prev, client, seq, runs, _,
         data) = (c.append for c in cols)
        for entry in archive.read_segment(record):
            i = entry.index
            if i <= last:
                continue
            if i > upto:
                break
            last = i
            index(i)
            term(entry.term)
            ts_ms(entry.ts_ms)
            kind(entry.kind)
            fields = decode_fields(entry.data) if entry.kind == normal else None
            if fields is None:
                op(BAD if entry.kind == normal else None)
                for add in (key, value, prev, client, seq, runs):
                    add(None)
                data(entry.data if entry.kind == membership else None)
                continue
            op(fields[0])
            key(fields[1])
            value(fields[2])
            prev(fields[3])
            client(fields[4])
            seq(fields[5])
            if fields[6] > run:
                run = fields[6]
            runs(run)
            data(None)
        count = len(cols[0])
        if count:
            cols[11] = [part] * count
            yield pa.RecordBatch.from_arrays(
                [pa.array(c, type=f.type) for c, f in zip(cols, schema, strict=True)],
                schema=schema)
        if last >= upto:
            return


def arrow_schema(ddl: str) -> Any:
    """The Arrow schema of a Spark DDL string of the types the pipeline uses."""
    import pyarrow as pa

    types = {"long": pa.int64(), "int": pa.int32(), "byte": pa.int8(), "binary": pa.binary(),
             "string": pa.string()}
    return pa.schema([(name, types[kind]) for name, kind in
                      (part.split() for part in ddl.split(", "))])
