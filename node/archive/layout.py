"""Object names inside one cluster's part of the archive, `<archive root>/<cluster_id>/`.

    snapshots/<index:020d>-<term:020d>.snap   a snapshot file, byte for byte as the member wrote it
    segments/<first:020d>-<last:020d>.seg     committed entries first..last (segments.py)
    manifests/<seq:020d>.json                 what is archived; the highest seq is in force
    compacted/<first:020d>-<last:020d>-<through:020d>.seg
                                              a compacted segment standing for first..last,
                                              written by the compaction pass that cleaned
                                              through index `through`

Twenty digits hold any u64 and make the lexicographic order of a listing the numeric order.
"""

from __future__ import annotations

import re

SNAPSHOTS = "snapshots/"
SEGMENTS = "segments/"
MANIFESTS = "manifests/"
COMPACTED = "compacted/"

_SNAPSHOT = re.compile(r"^snapshots/(\d{20})-(\d{20})\.snap$")
_SEGMENT = re.compile(r"^segments/(\d{20})-(\d{20})\.seg$")
_COMPACTED = re.compile(r"^compacted/(\d{20})-(\d{20})-(\d{20})\.seg$")
_MANIFEST = re.compile(r"^manifests/(\d{20})\.json$")
_CLUSTER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def snapshot_key(index: int, term: int) -> str:
    return f"{SNAPSHOTS}{index:020d}-{term:020d}.snap"


def segment_key(first: int, last: int) -> str:
    return f"{SEGMENTS}{first:020d}-{last:020d}.seg"


def compacted_key(first: int, last: int, through: int) -> str:
    return f"{COMPACTED}{first:020d}-{last:020d}-{through:020d}.seg"


def parse_compacted_key(key: str) -> tuple[int, int, int] | None:
    """(first, last, through) of a compacted segment's name, or None if `key` is not one."""
    match = _COMPACTED.match(key)
    return (int(match.group(1)), int(match.group(2)), int(match.group(3))) if match else None


def manifest_key(seq: int) -> str:
    return f"{MANIFESTS}{seq:020d}.json"


def parse_snapshot_key(key: str) -> tuple[int, int] | None:
    """(index, term) of a snapshot object name, or None if `key` is not one."""
    match = _SNAPSHOT.match(key)
    return (int(match.group(1)), int(match.group(2))) if match else None


def parse_segment_key(key: str) -> tuple[int, int] | None:
    """(first, last) of a segment object name, or None if `key` is not one."""
    match = _SEGMENT.match(key)
    return (int(match.group(1)), int(match.group(2))) if match else None


def parse_manifest_key(key: str) -> int | None:
    match = _MANIFEST.match(key)
    return int(match.group(1)) if match else None


def check_cluster_id(cluster_id: str) -> str:
    """Cluster ids become a key prefix: keep them to one safe path segment."""
    if not _CLUSTER_ID.match(cluster_id):
        raise ValueError(
            f"cluster id {cluster_id!r} cannot name an archive prefix: use 1-128 letters, "
            "digits, '.', '_' or '-', starting with a letter or digit"
        )
    return cluster_id
