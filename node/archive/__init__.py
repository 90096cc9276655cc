"""Shipping snapshots and committed log segments to an archive, and restoring from one
(``flotilla.node.archive``); see docs/archive.md.

Layers, bottom up: `Archive` (protocol.py), an immutable-object store with two backends,
`S3Archive` (s3.py) and `FileArchive` (filesystem.py), picked by `open_archive(url)`; the key
layout (layout.py), the segment format (segments.py), the manifest (manifest.py) and its
MAC (signing.py); S3 server-side encryption options (sse.py);
`ClusterArchive` (cluster.py), one cluster's archive as the node uses it; restore planning
with its fallback to older snapshots (restore.py); and the resolution of a time to an index
from a manifest (timeindex.py). Every call blocks and is thread-safe: the node runs them on
worker threads.
"""

from .cluster import ClusterArchive, RetentionResult
from .errors import (
    ArchiveConflict,
    ArchiveCorrupt,
    ArchiveDiverged,
    ArchiveError,
    ArchiveNotFound,
    ArchiveUnavailable,
)
from .layout import manifest_key, segment_key, snapshot_key
from .manifest import Manifest, SegmentRecord, SnapshotRecord
from .protocol import Archive, ArchiveSettings, ObjectInfo
from .restore import PreparedRestore, RestorePlan, list_clusters, resolve_cluster_id
from .segments import decode_segment, encode_segment, read_segment_header
from .signing import ManifestKeys, ManifestNotAuthentic, SigningKey
from .sse import S3Encryption
from .timeindex import (
    TimeOutsideArchive,
    TimeRange,
    TimeTarget,
    format_ms,
    locate,
    parse_time,
    restorable_time_range,
    restorable_times,
)
from .urls import ArchiveURL, open_archive, parse_archive_url

__all__ = [
    "Archive",
    "ArchiveConflict",
    "ArchiveCorrupt",
    "ArchiveDiverged",
    "ArchiveError",
    "ArchiveNotFound",
    "ArchiveSettings",
    "ArchiveURL",
    "ArchiveUnavailable",
    "ClusterArchive",
    "Manifest",
    "ManifestKeys",
    "ManifestNotAuthentic",
    "ObjectInfo",
    "PreparedRestore",
    "RestorePlan",
    "RetentionResult",
    "S3Encryption",
    "SegmentRecord",
    "SigningKey",
    "SnapshotRecord",
    "TimeOutsideArchive",
    "TimeRange",
    "TimeTarget",
    "decode_segment",
    "encode_segment",
    "format_ms",
    "list_clusters",
    "locate",
    "manifest_key",
    "open_archive",
    "parse_archive_url",
    "parse_time",
    "read_segment_header",
    "resolve_cluster_id",
    "restorable_time_range",
    "restorable_times",
    "segment_key",
    "snapshot_key",
]
