"""Archived entries into Spark, without Hadoop's S3 connector.

The driver plans from the manifest; Spark only sees a small table of segment records, split
into a few large tasks. Each task fetches its segments with the project's own archive client
(one client per Python worker, kept for the worker's life: building a boto3 client costs more
than reading a segment), verifies them whole (SHA-256 against the manifest, every record's
CRC, the index range), decodes the key-value commands and hands Spark Arrow batches. Nothing
unverified enters Spark.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from flotilla.node.archive import ClusterArchive, open_archive
from flotilla.node.archive.manifest import SegmentRecord
from flotilla.node.consensus import EntryKind

from .kvfold import decode

__all__ = ["OPS_SCHEMA", "ArchiveRef", "decode_segments", "key_bytes", "key_text"]

PUT, DELETE, BAD = 0, 1, -1

# One row per entry: kind is the entry kind; op/key/... only for normal entries (op BAD for a
# command that does not decode); data only for membership entries. seg is the first index of
# the segment the entry came from (the unit of the clock's prefix). ts_ms is the entry's own
# time (its leader's clock at append; 0 when unknown), ts the key-value command's.
OPS_SCHEMA = ("index long, term long, ts_ms long, kind byte, op byte, key binary, "
              "value binary, prev_index long, client binary, seq long, ts long, seg long, "
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


def key_bytes(key: str) -> bytes:
    """Keys and client ids as Spark carries them: UTF-8 bytes, lone surrogates kept. Binary
    order of UTF-8 is the code-point order the machine sorts keys by."""
    return key.encode("utf-8", "surrogatepass")


def key_text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogatepass")


def decode_segments(ref: ArchiveRef, upto: int, segments: Sequence[SegmentRecord],
                    above: int = 0) -> Iterator[dict[str, list[Any]]]:
    """The entries above index `above` and up to `upto` of `segments`, as column batches of
    OPS_SCHEMA (one batch per segment)."""
    archive = cluster_archive(ref)
    for record in segments:
        cols: dict[str, list[Any]] = {name: [] for name in _COLUMNS}
        for entry in archive.read_segment(record):
            if entry.index <= above or entry.index > upto:
                continue
            cols["index"].append(entry.index)
            cols["term"].append(entry.term)
            cols["ts_ms"].append(entry.ts_ms)
            cols["kind"].append(entry.kind)
            cols["seg"].append(record.first)
            if entry.kind == EntryKind.NORMAL:
                op = decode(entry.index, entry.data)
                cols["op"].append(BAD if op.op is None else PUT if op.op == "put" else DELETE)
                cols["key"].append(None if op.op is None else key_bytes(op.key))
                cols["value"].append(None if op.op is None else op.value)
                cols["prev_index"].append(op.prev_index)
                cols["client"].append(None if op.client is None else key_bytes(op.client))
                cols["seq"].append(op.seq)
                cols["ts"].append(None if op.op is None else op.ts)
                cols["data"].append(None)
            else:
                for name in ("op", "key", "value", "prev_index", "client", "seq", "ts"):
                    cols[name].append(None)
                cols["data"].append(entry.data if entry.kind == EntryKind.MEMBERSHIP else None)
        yield cols


_COLUMNS = [part.split()[0] for part in OPS_SCHEMA.split(", ")]
