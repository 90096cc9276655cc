"""The manifest: which snapshots and segments a cluster's archive holds, and what they can
rebuild. Pure data and arithmetic, no I/O (cluster.py reads and writes manifests).

A manifest is an immutable JSON object `manifests/<seq>.json`; the one with the highest seq is
in force. Older ones are history that retention trims.

Restorable states. A *base* is a snapshot, or the empty state at index 0. From a base at index
b, the segments reach index r(b): the largest r such that b+1..r is covered by segments with no
gap (segments may overlap; committed entries are the same in every copy). Every index in
b..r(b) can be rebuilt: restore the base, replay entries up to that index. The manifest's
`last_archived_index` is the largest r(b) over all bases. When there is no gap it is exactly
"everything from the oldest kept snapshot up to it is covered"; after a gap (say the archive was
unreachable while the member compacted its log) it moves on with the first snapshot uploaded
after the gap, so it keeps measuring how far behind the archive is.

Invariant (kept by `Manifest.create` and checked by `from_json`): snapshots are sorted by index
and segments by (first, last), keys are unique, and no record lies wholly below
`retention_floor` (the oldest kept snapshot when retention last ran: history before it was
deleted, and a writer that still holds an old record must not bring it back).

Time. Each segment record may carry `first_ts_ms` and `last_ts_ms`, the times of its first and
last entries, and each snapshot record `ts_ms`, the time of the entry at its index (see
`Entry.ts_ms`). They are optional: absent in manifests of the first release, and wherever the
time is unknown (entries written before entries carried one). Times never decrease along the
log, so these ranges let timeindex.py resolve a time to segments without reading them. Old
builds ignore the fields, so the manifest format version is unchanged.

Compaction (`flotilla pipeline compact`, Kafka's log compaction). A manifest may hold
*compacted* segment records (`"compacted": true`, with `entries`, the records kept): each
stands for first..last but keeps only the last effective change of each key in it, and delete
markers within their retention. They rebuild no state: `reach`, `chain` and so every restore
ignore them. `cleaned_through` is the index the compacted log reaches (0: never compacted);
the archive holds a snapshot there, the *cleanable point*, from which the head is restorable,
and the raw segments at or below it are gone. `log_start` is where the compacted log begins:
the empty state (0), or the snapshot the history started from when compaction first ran (then
kept whatever the retention floor, since the keys it holds have no entry left in the log).
Compacted records are kept whatever the retention floor: they are the history compaction
keeps. A manifest with either is written as format version 2, which builds that cannot read
compacted segments refuse.

Signing. Written with `ManifestKeys`, a manifest carries a `mac` field over the rest of its
content (signing.py), which readers given keys require and check before they read anything
else from it; readers without keys ignore it, so signing changes no format version.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .errors import ArchiveCorrupt
from .signing import FIELD as MAC_FIELD
from .signing import ManifestKeys

FORMAT = "flotilla-archive-manifest"
VERSION = 1  # without compaction
COMPACTED_VERSION = 2  # with compacted segments or a cleaned_through
VERSIONS = (VERSION, COMPACTED_VERSION)


@dataclass(frozen=True, slots=True)
class SnapshotRecord:
    index: int
    term: int
    key: str  # relative to the cluster's prefix, e.g. "snapshots/…-….snap"
    size: int  # bytes ("bytes" in the JSON)
    sha256: str
    ts_ms: int | None = None  # the time of the entry at `index`; None: unknown

    def to_json(self) -> dict[str, Any]:
        document = {"index": self.index, "term": self.term, "key": self.key,
                    "bytes": self.size, "sha256": self.sha256}
        if self.ts_ms is not None:
            document["ts_ms"] = self.ts_ms
        return document


@dataclass(frozen=True, slots=True)
class SegmentRecord:
    first: int
    last: int
    key: str
    size: int
    sha256: str
    first_ts_ms: int | None = None  # the time of entry `first`; None: unknown
    last_ts_ms: int | None = None  # the time of entry `last`; None: unknown
    compacted: bool = False  # keeps only some entries of first..last (segments.COMPACTED)
    entries: int | None = None  # compacted: how many entries it keeps

    def to_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {"first": self.first, "last": self.last, "key": self.key,
                                    "bytes": self.size, "sha256": self.sha256}
        if self.first_ts_ms is not None:
            document["first_ts_ms"] = self.first_ts_ms
        if self.last_ts_ms is not None:
            document["last_ts_ms"] = self.last_ts_ms
        if self.compacted:
            document["compacted"] = True
            document["entries"] = self.entries or 0
        return document


def known_time(ts_ms: int) -> int | None:
    """A manifest's view of an entry's `ts_ms`: 0 (unknown) is left out of the manifest."""
    return ts_ms or None


@dataclass(frozen=True, slots=True)
class Manifest:
    cluster_id: str
    seq: int
    created: str  # ISO 8601 UTC, for people; ordering is by seq
    snapshots: tuple[SnapshotRecord, ...] = ()
    segments: tuple[SegmentRecord, ...] = ()
    retention_floor: int = 0
    cleaned_through: int = 0  # compaction reached this index (0: never compacted)
    log_start: int = 0  # where the compacted log begins (a kept snapshot's index, or 0)

    @property
    def version(self) -> int:
        compacted = self.cleaned_through or any(s.compacted for s in self.segments)
        return COMPACTED_VERSION if compacted else VERSION

    @classmethod
    def create(
        cls,
        cluster_id: str,
        seq: int,
        created: str,
        snapshots: Iterable[SnapshotRecord] = (),
        segments: Iterable[SegmentRecord] = (),
        retention_floor: int = 0,
        cleaned_through: int = 0,
        log_start: int = 0,
    ) -> Manifest:
        """A manifest holding these records, deduplicated by key and sorted, minus records
        wholly below the retention floor (compacted segments, and the snapshot the compacted
        log starts from, are kept)."""
        kept_snapshots = {s.key: s for s in snapshots if s.index >= retention_floor
                          or (cleaned_through and s.index == log_start)}
        kept_segments = {s.key: s for s in segments if s.last > retention_floor or s.compacted}
        return cls(
            cluster_id,
            seq,
            created,
            tuple(sorted(kept_snapshots.values(), key=lambda s: (s.index, s.term))),
            tuple(sorted(kept_segments.values(), key=lambda s: (s.first, s.last, s.key))),
            retention_floor,
            cleaned_through,
            log_start,
        )

    def merged(
        self,
        *,
        seq: int,
        created: str,
        snapshots: Iterable[SnapshotRecord] = (),
        segments: Iterable[SegmentRecord] = (),
    ) -> Manifest:
        """The next manifest: this one's records plus these."""
        return Manifest.create(
            self.cluster_id, seq, created, (*self.snapshots, *snapshots),
            (*self.segments, *segments), self.retention_floor, self.cleaned_through,
            self.log_start,
        )

    def same_records(self, other: Manifest) -> bool:
        return (self.snapshots, self.segments, self.retention_floor, self.cleaned_through,
                self.log_start) == (other.snapshots, other.segments, other.retention_floor,
                                    other.cleaned_through, other.log_start)

    @property
    def raw_segments(self) -> tuple[SegmentRecord, ...]:
        """The segments that hold every entry of their range (the ones restores replay)."""
        return tuple(s for s in self.segments if not s.compacted)

    @property
    def compacted_segments(self) -> tuple[SegmentRecord, ...]:
        return tuple(s for s in self.segments if s.compacted)

    # --- what it can rebuild ------------------------------------------------------------------

    def bases(self) -> list[int]:
        """Indexes a restore can start from, oldest first: 0 (the empty state) and every
        snapshot's."""
        return sorted({0, *(s.index for s in self.snapshots)})

    def reach(self, base: int) -> int:
        """The highest index the segments cover without a gap from `base` + 1 (or `base`)."""
        covered = base
        for segment in self.raw_segments:  # sorted by first
            if segment.first > covered + 1:
                break
            covered = max(covered, segment.last)
        return covered

    def chain(self, base: int, target: int) -> tuple[SegmentRecord, ...] | None:
        """The fewest segments that cover base+1..target, in order (None if there is a gap).

        Greedy: at each step take, among the segments that start at or before the next index
        needed, the one that reaches furthest. A segment passed over at one step never helps
        later (it ends before the one chosen)."""
        picked: list[SegmentRecord] = []
        covered = base
        position = 0
        segments = self.raw_segments
        while covered < target:
            best = None
            while position < len(segments) and segments[position].first <= covered + 1:
                candidate = segments[position]
                if candidate.last > covered and (best is None or candidate.last > best.last):
                    best = candidate
                position += 1
            if best is None:
                return None
            picked.append(best)
            covered = best.last
        return tuple(picked)

    @property
    def last_archived_index(self) -> int:
        return max(self.reach(base) for base in self.bases())

    @property
    def last_snapshot(self) -> SnapshotRecord | None:
        return self.snapshots[-1] if self.snapshots else None

    def restorable_ranges(self) -> list[tuple[int, int]]:
        """Every index that can be rebuilt, as merged inclusive ranges."""
        ranges = sorted(
            (base, self.reach(base))
            for base in self.bases()
            if base > 0 or self.reach(0) > 0
        )
        merged: list[tuple[int, int]] = []
        for low, high in ranges:
            if merged and low <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(merged[-1][1], high))
            else:
                merged.append((low, high))
        return merged

    # --- JSON ---------------------------------------------------------------------------------

    def to_json(self, keys: ManifestKeys | None = None) -> bytes:
        """The manifest's bytes; with `keys`, signed by the first of them."""
        document: dict[str, Any] = {
            "format": FORMAT,
            "version": self.version,
            "cluster_id": self.cluster_id,
            "seq": self.seq,
            "created": self.created,
            "last_archived_index": self.last_archived_index,
            "retention_floor": self.retention_floor,
            **({"cleaned_through": self.cleaned_through, "log_start": self.log_start}
               if self.version == COMPACTED_VERSION else {}),
            "snapshots": [s.to_json() for s in self.snapshots],
            "segments": [s.to_json() for s in self.segments],
        }
        if keys is not None:
            document[MAC_FIELD] = keys.sign(document)
        return (json.dumps(document, indent=1) + "\n").encode()

    @classmethod
    def from_json(cls, data: bytes, *, name: str = "manifest",
                  keys: ManifestKeys | None = None) -> Manifest:
        """Parse and check a manifest; any problem is ArchiveCorrupt naming `name`. With
        `keys`, its MAC is checked before anything in it is used (ManifestNotAuthentic)."""
        try:
            document = json.loads(data)
            if document.get("format") != FORMAT:
                raise ValueError(f"format is {document.get('format')!r}, not {FORMAT!r}")
            if keys is not None:
                keys.verify(document, name)
            if document.get("version") not in VERSIONS:
                raise ArchiveCorrupt(
                    f"{name} is manifest format version {document.get('version')}, but this "
                    f"build reads versions {', '.join(map(str, VERSIONS))}: use the Flotilla "
                    "version that wrote it",
                    key=name,
                )
            snapshots = tuple(
                SnapshotRecord(_int(s["index"]), _int(s["term"]), str(s["key"]),
                               _int(s["bytes"]), str(s["sha256"]), _optional_int(s, "ts_ms"))
                for s in document["snapshots"]
            )
            segments = tuple(
                SegmentRecord(_int(s["first"]), _int(s["last"]), str(s["key"]),
                              _int(s["bytes"]), str(s["sha256"]),
                              _optional_int(s, "first_ts_ms"), _optional_int(s, "last_ts_ms"),
                              _bool(s.get("compacted", False)),
                              _optional_int(s, "entries") if s.get("compacted") else None)
                for s in document["segments"]
            )
            manifest = cls.create(
                str(document["cluster_id"]), _int(document["seq"]), str(document["created"]),
                snapshots, segments, _int(document.get("retention_floor", 0)),
                _int(document.get("cleaned_through", 0)), _int(document.get("log_start", 0)),
            )
        except ArchiveCorrupt:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ArchiveCorrupt(f"{name} is not a valid manifest: {exc}", key=name) from exc
        if (manifest.snapshots, manifest.segments) != (snapshots, segments) or any(
            s.first > s.last for s in segments
        ):
            raise ArchiveCorrupt(
                f"{name} is not a valid manifest: records are unsorted, duplicated, inverted "
                "or below its retention floor",
                key=name,
            )
        inverted = [s.key for s in segments if s.first_ts_ms is not None
                    and s.last_ts_ms is not None and s.first_ts_ms > s.last_ts_ms]
        if inverted:
            raise ArchiveCorrupt(
                f"{name} is not a valid manifest: segment {inverted[0]} ends at an earlier time "
                "than it starts",
                key=name,
            )
        return manifest


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{value!r} is not true or false")
    return value


def _optional_int(document: dict[str, Any], key: str) -> int | None:
    return None if document.get(key) is None else _int(document[key])


def _int(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{value!r} is not a non-negative integer")
    return value
