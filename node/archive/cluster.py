"""`ClusterArchive`: one cluster's snapshots, segments and manifests in an archive.

Writing (the leader, from worker threads): `upload_snapshot` and `upload_segment` put immutable
objects and remember them as *pending*; `publish` writes the next manifest (the newest one plus
everything pending) as a create-only object, so two writers can never both publish the same
seq: the loser reloads, merges and tries the next seq. `retain` trims old snapshots, the
segments only they needed, and old manifests.

Reading (a restoring node, a catching-up learner, the pipeline): `plan_restore` picks the newest
snapshot at or below an index plus the segments after it; `restore_candidates` lists every
such plan, newest first, so that a corrupt object can be worked around by an older snapshot and
more segments; `prepare_restore` does exactly that and hands back verified local files (the
planning and fallback logic lives in restore.py).

Every read is checked twice: against the object's own recorded SHA-256 and against the digest
the manifest recorded for it. Given `keys` (signing.py), every manifest written is signed and
every manifest read must verify; one that does not stops the reader (`ManifestNotAuthentic`),
never falls back to an older one.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from flotilla.node.consensus.types import Entry, SnapshotMeta
from flotilla.node.storage.errors import CorruptDataError
from flotilla.node.storage.snapshots import PayloadReader

from .errors import ArchiveConflict, ArchiveCorrupt, ArchiveError, ArchiveNotFound
from .layout import (
    COMPACTED,
    MANIFESTS,
    SEGMENTS,
    SNAPSHOTS,
    check_cluster_id,
    compacted_key,
    manifest_key,
    parse_manifest_key,
    parse_segment_key,
    parse_snapshot_key,
    segment_key,
    snapshot_key,
)
from .manifest import Manifest, SegmentRecord, SnapshotRecord, known_time
from .protocol import Archive, ObjectInfo
from .restore import PreparedRestore, RestorePlan, plan_candidates, prepare_restore, replay
from .segments import (
    SegmentHeader,
    decode_segment,
    decode_with_header,
    encode_compacted,
    encode_segment,
    read_segment_header,
)
from .signing import ManifestKeys, ManifestNotAuthentic
from .timeindex import locate

log = logging.getLogger(__name__)

PUBLISH_ATTEMPTS = 5
RETAIN_BUDGET_S = 30.0  # retention runs in the archiving leader's round


@dataclass(frozen=True, slots=True)
class RetentionResult:
    manifest: Manifest | None  # the manifest in force afterwards
    deleted: tuple[str, ...]  # keys relative to the cluster's prefix


class ClusterArchive:
    """The archive of cluster `cluster_id`: objects under `<archive root>/<cluster_id>/`.

    Thread-safe: uploads may run concurrently; publish and retain are serialised per instance
    (and across instances and processes by create-only manifests).
    """

    def __init__(
        self,
        archive: Archive,
        cluster_id: str,
        *,
        clock: Callable[[], float] = time.time,
        keys: ManifestKeys | None = None,
    ) -> None:
        self.archive = archive
        self.cluster_id = check_cluster_id(cluster_id)
        self._clock = clock
        self._keys = keys
        self._lock = threading.Lock()  # guards the fields below
        self._publish_lock = threading.Lock()  # one publish or retain at a time
        self._loaded = False
        self._known: Manifest | None = None  # the newest manifest seen or published
        self._highest_seq = 0  # the highest manifest seq seen, readable or not
        self._pending_snapshots: dict[str, SnapshotRecord] = {}
        self._pending_segments: dict[str, SegmentRecord] = {}
        self._uploading: dict[str, tuple[int, int]] = {}  # segment key -> (first, last)

    def __repr__(self) -> str:
        return f"ClusterArchive({self.url!r})"

    @property
    def url(self) -> str:
        return self.archive.url_for(self.cluster_id)

    def location(self, record: SnapshotRecord | SegmentRecord) -> str:
        """The full URL of an archived object (the admin API's `location`)."""
        return self.archive.url_for(self._full(record.key))

    def _full(self, key: str) -> str:
        return f"{self.cluster_id}/{key}"

    # --- manifests ----------------------------------------------------------------------------

    def manifest(self) -> Manifest | None:
        """The newest readable manifest (None if nothing was ever published), read afresh.

        A newest manifest that does not read is read again a few times first: another writer
        may be finishing it (a file archive records an object's checksum just after the object
        appears), and a writer that skipped it would publish the next manifest without what it
        added. A damaged one is then skipped with a WARNING for the one before it (its seq is
        never reused); if every manifest is damaged this raises ArchiveCorrupt. A manifest
        that reads but is not authentic (with `keys`) raises ManifestNotAuthentic at once."""
        seqs = sorted(
            (seq for key in self.archive.list_keys(self._full(MANIFESTS))
             if (seq := parse_manifest_key(key[len(self.cluster_id) + 1:])) is not None),
            reverse=True,
        )
        failures = []
        found = None
        for seq in seqs:
            name = self.archive.url_for(self._full(manifest_key(seq)))
            try:
                found = self._read_manifest_settled(seq, name, retry=not failures)
                break
            except ManifestNotAuthentic:
                raise
            except ArchiveCorrupt as exc:
                log.warning("%s; falling back to the manifest before it", exc)
                failures.append(exc)
            except ArchiveNotFound:
                continue  # an old one retention deleted after the listing: skip it
        with self._lock:
            self._loaded = True
            self._highest_seq = max([self._highest_seq, *seqs[:1]])
            if found is not None and (self._known is None or found.seq >= self._known.seq):
                self._known = found
        if found is None and failures:
            raise ArchiveCorrupt(
                f"none of the {len(failures)} manifests of {self.url} is readable (newest: "
                f"{failures[0]}); the archive index is lost: rebuild it from the objects, or "
                "restore from a member's data",
                key=failures[0].key,
            )
        return found

    def _read_manifest_settled(self, seq: int, name: str, *, retry: bool) -> Manifest:
        for delay in (0.01, 0.03, 0.1, 0.3) if retry else ():
            try:
                return self._read_manifest(seq, name)
            except ManifestNotAuthentic:
                raise
            except ArchiveCorrupt:
                time.sleep(delay)
        return self._read_manifest(seq, name)

    def _read_manifest(self, seq: int, name: str) -> Manifest:
        data = self.archive.get_bytes(self._full(manifest_key(seq)))
        manifest = Manifest.from_json(data, name=name, keys=self._keys)
        if manifest.seq != seq or manifest.cluster_id != self.cluster_id:
            raise ArchiveCorrupt(
                f"{name} says it is manifest {manifest.seq} of cluster {manifest.cluster_id!r}: "
                "it was copied into the wrong place",
                key=name,
            )
        return manifest

    @property
    def cached_manifest(self) -> Manifest | None:
        """The newest manifest this object has read or published, without any I/O (for
        status reporting)."""
        with self._lock:
            return self._known

    def _ensure_loaded(self) -> None:
        with self._lock:
            loaded = self._loaded
        if not loaded:
            self.manifest()

    def _now(self) -> str:
        return datetime.fromtimestamp(self._clock(), UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    def next_manifest(self) -> Manifest:
        """The manifest `publish()` would write now: the newest known plus everything pending."""
        self._ensure_loaded()
        with self._lock:
            base = self._known
            seq = max(base.seq if base else 0, self._highest_seq) + 1
            snapshots = list(self._pending_snapshots.values())
            segments = list(self._pending_segments.values())
        if base is None:
            return Manifest.create(self.cluster_id, seq, self._now(), snapshots, segments)
        return base.merged(seq=seq, created=self._now(), snapshots=snapshots, segments=segments)

    def publish(self, manifest: Manifest | None = None) -> Manifest:
        """Make uploads visible: write the next manifest and return it.

        With no argument, writes `next_manifest()`; if another writer published that seq first,
        reloads theirs, merges what is pending into it and tries again. If nothing is pending,
        nothing is written and the newest manifest is returned. With an explicit `manifest`,
        writes exactly that (ArchiveConflict if its seq is taken by a different one)."""
        with self._publish_lock:
            if manifest is not None:
                if manifest.cluster_id != self.cluster_id:
                    raise ValueError(
                        f"manifest of cluster {manifest.cluster_id!r} given to {self!r}"
                    )
                self._write_manifest(manifest)
                return manifest
            for _ in range(PUBLISH_ATTEMPTS):
                candidate = self.next_manifest()
                known = self.cached_manifest
                if known is not None and candidate.same_records(known):
                    self._forget_pending(candidate)
                    return known
                try:
                    self._write_manifest(candidate)
                except ArchiveConflict as exc:
                    log.info("%s; merging with the newer manifest and retrying", exc)
                    self.manifest()
                    continue
                return candidate
        raise ArchiveConflict(
            f"could not publish a manifest for {self.url}: other writers published "
            f"{PUBLISH_ATTEMPTS} times in a row meanwhile; is more than one leader archiving?"
        )

    def _write_manifest(self, manifest: Manifest) -> None:
        key = manifest_key(manifest.seq)
        try:
            self.archive.put_bytes(self._full(key), manifest.to_json(self._keys))
        except ArchiveConflict:
            with self._lock:
                self._highest_seq = max(self._highest_seq, manifest.seq)
            raise ArchiveConflict(
                f"manifest {manifest.seq} of {self.url} was published by another writer first"
            ) from None
        with self._lock:
            self._highest_seq = max(self._highest_seq, manifest.seq)
            if self._known is None or manifest.seq > self._known.seq:
                self._known = manifest
        self._forget_pending(manifest)

    def _forget_pending(self, published: Manifest) -> None:
        """Drop pending records the published manifest holds, or deliberately left out (they
        lie below its retention floor)."""
        floor = published.retention_floor
        keys = {s.key for s in published.snapshots} | {s.key for s in published.segments}
        with self._lock:
            for key, snapshot in list(self._pending_snapshots.items()):
                if key in keys or snapshot.index < floor:
                    del self._pending_snapshots[key]
            for key, segment in list(self._pending_segments.items()):
                if key in keys or segment.last <= floor:
                    del self._pending_segments[key]

    # --- uploads ------------------------------------------------------------------------------

    def upload_snapshot(self, path: str | os.PathLike[str], meta: SnapshotMeta) -> SnapshotRecord:
        """Upload the snapshot file at `path` (unchanged, so it verifies with the snapshot
        reader) as pending; `publish()` makes it visible. Idempotent. Its manifest record takes
        its time from the file's own header."""
        try:
            with PayloadReader(Path(path)) as reader:
                found = reader.meta
        except CorruptDataError as exc:
            raise ArchiveError(f"will not archive a damaged snapshot: {exc}") from exc
        if (found.index, found.term) != (meta.index, meta.term):
            raise ValueError(
                f"{path} holds the snapshot at index {found.index} term {found.term}, not "
                f"index {meta.index} term {meta.term}"
            )
        key = snapshot_key(meta.index, meta.term)
        info = self.archive.put_file(self._full(key), path)
        record = SnapshotRecord(meta.index, meta.term, key, info.size, info.sha256 or "",
                                known_time(found.ts_ms))
        with self._lock:
            self._pending_snapshots[key] = record
        return record

    def upload_segment(self, entries: Sequence[Entry]) -> SegmentRecord:
        """Upload committed `entries` (consecutive) as one segment object, pending `publish()`.

        Refuses (ArchiveError) a segment that overlaps one already archived, pending or being
        uploaded, unless it is exactly the same range (then this is an idempotent re-upload), and
        one that would leave a gap: its first index must directly follow a snapshot or another
        segment (or be 1 while no snapshot is archived)."""
        entries = list(entries)
        data = encode_segment(self.cluster_id, entries)
        first, last = entries[0].index, entries[-1].index
        key = segment_key(first, last)
        self._ensure_loaded()
        with self._lock:
            known = self._known
            snapshots = [*(known.snapshots if known else ()), *self._pending_snapshots.values()]
            segments = [*(known.segments if known else ()), *self._pending_segments.values()]
            ranges = [(s.first, s.last) for s in segments] + list(self._uploading.values())
            if (first, last) not in ranges:
                self._check_fits(first, last, snapshots, ranges)
                self._uploading[key] = (first, last)
        try:
            try:
                info = self.archive.put_bytes(self._full(key), data)
            except ArchiveConflict:
                info, entries = self._earlier_upload(key, entries)
        finally:
            with self._lock:
                self._uploading.pop(key, None)
        record = SegmentRecord(first, last, key, info.size, info.sha256 or "",
                               known_time(entries[0].ts_ms), known_time(entries[-1].ts_ms))
        with self._lock:
            self._pending_segments[key] = record
        return record

    def _earlier_upload(self, key: str, entries: list[Entry]) -> tuple[ObjectInfo, list[Entry]]:
        """The object already at `key`, if it holds exactly `entries` in an older encoding
        (uploaded by a build that wrote no times, and never published: a crash, or a leader
        change, came before its manifest). Its own entries are returned: its times are what the
        archive records. Raises ArchiveConflict when it holds anything else."""
        name = self.archive.url_for(self._full(key))
        data = self.archive.get_bytes(self._full(key))
        found = decode_segment(data, name=name, cluster_id=self.cluster_id)
        same = len(found) == len(entries) and all(
            (old.index, old.term, old.kind, old.data) == (new.index, new.term, new.kind, new.data)
            and old.ts_ms in (0, new.ts_ms)
            for old, new in zip(found, entries, strict=True)
        )
        if not same:
            raise ArchiveConflict(
                f"{name} already exists and holds other entries than this member's log has for "
                f"{entries[0].index}..{entries[-1].index}; is another cluster archiving under "
                f"the same id?"
            )
        return ObjectInfo(key, len(data), hashlib.sha256(data).hexdigest()), found

    def _check_fits(
        self,
        first: int,
        last: int,
        snapshots: Iterable[SnapshotRecord],
        ranges: Iterable[tuple[int, int]],
    ) -> None:
        ranges = sorted(ranges)
        for low, high in ranges:
            if low <= last and first <= high:
                raise ArchiveError(
                    f"segment {first}..{last} overlaps segment {low}..{high} already archived "
                    f"for {self.url}; archive only entries after index {high}"
                )
        snapshot_indexes = {s.index for s in snapshots}
        anchors = snapshot_indexes | {high for _, high in ranges}
        if not snapshot_indexes:
            anchors.add(0)
        if first - 1 not in anchors:
            below = max((a for a in anchors if a < first), default=None)
            raise ArchiveError(
                f"segment {first}..{last} would leave a gap in {self.url}: nothing archived "
                f"ends at index {first - 1} (the closest is {below}); upload the entries after "
                f"{below}, or first upload a snapshot at index {first - 1}"
            )

    # --- retention ----------------------------------------------------------------------------

    def retain(self, keep_snapshots: int = 2, *, keep_manifests: int = 3) -> RetentionResult:
        """Keep the newest `keep_snapshots` snapshots and the segments needed to rebuild any
        index from the oldest of them onward; delete the rest, and all but the newest
        `keep_manifests` manifests. Never deletes what the newest manifest references.

        Objects below the new floor that no manifest references (left by a crash between upload
        and publish) are deleted too; unreferenced objects above it are left alone, since
        another writer may be about to publish them."""
        if keep_snapshots < 1 or keep_manifests < 1:
            raise ValueError("retention keeps at least one snapshot and one manifest")
        with self._publish_lock:
            current = self._retain_manifest(keep_snapshots)
            if current is None:
                return RetentionResult(None, ())
            referenced = {s.key for s in current.snapshots} | {s.key for s in current.segments}
            floor = current.retention_floor
            doomed: list[str] = []
            for full in self.archive.list_keys(self._full(SNAPSHOTS)):
                key = full[len(self.cluster_id) + 1:]
                position = parse_snapshot_key(key)
                if position and position[0] < floor and key not in referenced:
                    doomed.append(key)
            for full in self.archive.list_keys(self._full(SEGMENTS)):
                key = full[len(self.cluster_id) + 1:]
                span = parse_segment_key(key)
                if span and span[1] <= floor and key not in referenced:
                    doomed.append(key)
            manifests = sorted(
                seq for full in self.archive.list_keys(self._full(MANIFESTS))
                if (seq := parse_manifest_key(full[len(self.cluster_id) + 1:])) is not None
            )
            doomed.extend(
                manifest_key(seq) for seq in manifests[:-keep_manifests] if seq < current.seq
            )
            for key in doomed:
                self.archive.delete(self._full(key))
            if doomed:
                log.info("retention removed %d objects from %s", len(doomed), self.url)
            return RetentionResult(current, tuple(doomed))

    def _retain_manifest(self, keep_snapshots: int) -> Manifest | None:
        """Publish a manifest without what falls below the kept snapshots; return the manifest
        in force afterwards."""

        def trim(current: Manifest) -> Manifest | None:
            if len(current.snapshots) <= keep_snapshots:
                return None
            floor = max(current.snapshots[-keep_snapshots].index, current.retention_floor)
            if current.cleaned_through:
                # Compaction owns the history: what it has not cleaned yet stays for it.
                floor = max(min(floor, current.cleaned_through), current.retention_floor)
                if floor == current.retention_floor:
                    return None
            return Manifest.create(self.cluster_id, current.seq, current.created,
                                   current.snapshots, current.segments, floor,
                                   current.cleaned_through, current.log_start)

        return self._publish_built(trim, RETAIN_BUDGET_S)

    # --- restore ------------------------------------------------------------------------------

    def restore_candidates(self, index: int | None = None) -> list[RestorePlan]:
        """Every way to rebuild the state at `index` (None: the newest archived state), newest
        snapshot first. Later candidates start from older snapshots and need more segments:
        try the next one when a download raises ArchiveCorrupt (`prepare_restore` does)."""
        manifest = self.manifest()
        if manifest is None:
            raise ArchiveNotFound(
                f"nothing is archived for cluster {self.cluster_id!r} at {self.url} (no "
                "manifest); check --restore-from and --restore-cluster-id"
            )
        return plan_candidates(manifest, index, self.url)

    def index_at_time(self, ts_ms: int, *, inclusive: bool = True) -> int:
        """The last restorable index stamped at or before `ts_ms` (before it, when not
        `inclusive`): what `--restore-time` and the pipeline's `--time` restore. Reads the
        manifest and, when the manifest's time points do not pin the index down, the one
        segment that holds it. Raises TimeOutsideArchive naming the restorable times, or
        ArchiveNotFound when nothing is archived."""
        manifest = self.manifest()
        if manifest is None:
            raise ArchiveNotFound(
                f"nothing is archived for cluster {self.cluster_id!r} at {self.url} (no "
                "manifest); check the archive URL and the cluster id"
            )
        target = locate(manifest, ts_ms, inclusive=inclusive, url=self.url)
        if target.exact:
            return target.index
        assert target.segment is not None
        return target.resolve(self.read_segment(target.segment))

    def plan_restore(self, index: int | None = None) -> RestorePlan:
        """The newest snapshot at or below `index` plus the segments after it up to `index`."""
        return self.restore_candidates(index)[0]

    def download_snapshot(
        self, entry: SnapshotRecord, dest_path: str | os.PathLike[str]
    ) -> SnapshotMeta:
        """Download a snapshot to `dest_path` (which appears only when verified: SHA-256 against
        the manifest and the object, then the snapshot's own header) and return its metadata."""
        dest = Path(dest_path)
        name = self.location(entry)
        self.archive.download(self._full(entry.key), dest, expected_sha256=entry.sha256)
        try:
            with PayloadReader(dest) as reader:
                meta = reader.meta
        except CorruptDataError as exc:
            dest.unlink(missing_ok=True)
            raise ArchiveCorrupt(
                f"{name} matches its checksum but is not a valid snapshot ({exc.reason})",
                key=name,
            ) from exc
        if (meta.index, meta.term) != (entry.index, entry.term):
            dest.unlink(missing_ok=True)
            raise ArchiveCorrupt(
                f"{name} holds the snapshot at index {meta.index} term {meta.term}, not the "
                f"index {entry.index} term {entry.term} its name and the manifest say",
                key=name,
            )
        return meta

    def last_archived_term(self, manifest: Manifest) -> int | None:
        """The term the archive records for its last archived entry (`last_archived_index`):
        that of the last entry of the raw segment ending there (read and verified), else of the
        snapshot there. None when nothing is archived. What a leader that takes over archiving
        compares with its own log (archiver.py)."""
        index = manifest.last_archived_index
        ending = [s for s in manifest.raw_segments if s.last == index]
        if ending:
            return self.read_segment(ending[-1])[-1].term
        at = [s for s in manifest.snapshots if s.index == index]
        return at[-1].term if index and at else None

    def read_segment(self, segment: SegmentRecord) -> list[Entry]:
        """The entries of one archived segment, verified (SHA-256 and every record CRC); of a
        compacted one, the entries it keeps."""
        if segment.compacted:
            return self.read_compacted(segment)[1]
        name = self.location(segment)
        data = self.archive.get_bytes(self._full(segment.key), expected_sha256=segment.sha256)
        return self._decode(data, segment, name)

    def read_compacted(self, segment: SegmentRecord) -> tuple[SegmentHeader, list[Entry]]:
        """A compacted segment's header (its delete horizons) and kept entries, verified."""
        name = self.location(segment)
        data = self.archive.get_bytes(self._full(segment.key), expected_sha256=segment.sha256)
        header = read_segment_header(data, name=name)
        if (not header.compacted or header.cluster_id != self.cluster_id
                or (header.first, header.last) != (segment.first, segment.last)):
            raise ArchiveCorrupt(
                f"{name} is not the compacted segment {segment.first}..{segment.last} of "
                f"cluster {self.cluster_id!r} the manifest names", key=name)
        entries = decode_with_header(data, header, name=name)
        if segment.entries is not None and len(entries) != segment.entries:
            raise ArchiveCorrupt(f"{name} keeps {len(entries)} entries, not {segment.entries} "
                                 "as the manifest says", key=name)
        return header, entries

    # --- compaction ---------------------------------------------------------------------------

    def upload_compacted(self, first: int, last: int, through: int, entries: Sequence[Entry],
                         horizons: dict[int, int], times: tuple[int | None, int | None]
                         ) -> SegmentRecord:
        """Write a compacted segment (create-only) for the pass that cleans through `through`;
        not pending: the compaction's own manifest references it. An object already there
        with the same bytes (a rerun of the same pass) is taken as it is."""
        data = encode_compacted(self.cluster_id, first, last, entries, horizons)
        key = compacted_key(first, last, through)
        try:
            info = self.archive.put_bytes(self._full(key), data)
        except ArchiveConflict:
            found = self.archive.get_bytes(self._full(key))
            if found != data:
                raise ArchiveConflict(
                    f"{self.archive.url_for(self._full(key))} already exists with other "
                    "content: another compaction of this cluster ran with different settings; "
                    "run one compaction at a time") from None
            info = ObjectInfo(key, len(data), hashlib.sha256(data).hexdigest())
        return SegmentRecord(first, last, key, info.size, info.sha256 or "", times[0],
                             times[1], compacted=True, entries=len(entries))

    def publish_built(self, build: Callable[[Manifest], Manifest | None],
                      budget_s: float = 120.0) -> Manifest | None:
        """Publish `build(newest manifest)` as the next manifest (create-only; its seq and
        creation time are this call's). When another writer (the archiving leader) publishes
        that seq first, build again on theirs. `build` returns None when the manifest needs no
        change. Returns the manifest in force afterwards (None: nothing was ever published).
        Raises ArchiveConflict when it has lost every race for `budget_s` seconds."""
        with self._publish_lock:
            return self._publish_built(build, budget_s)

    def _publish_built(self, build: Callable[[Manifest], Manifest | None],
                       budget_s: float) -> Manifest | None:
        """`publish_built` with the publish lock held.

        Losing over and over to a leader that publishes several times a second is the risk:
        after the first listing, each attempt reads the manifest that won (by its seq, no
        listing) and tries the next seq at once, and waits a little, at random, only after a
        few losses in a row (a leader publishes in bursts, one per archiving round)."""
        deadline = time.monotonic() + budget_s
        rng = random.Random()
        current = self.manifest()
        losses = 0
        while current is not None:
            built = build(current)
            if built is None:
                return current
            seq = max(current.seq, self._highest_seq) + 1  # a damaged one is skipped
            candidate = replace(built, seq=seq, created=self._now())
            try:
                self._write_manifest(candidate)
                return candidate
            except ArchiveConflict as exc:
                losses += 1
                log.info("%s; building on it", exc)
            if time.monotonic() > deadline:
                raise ArchiveConflict(
                    f"could not publish to {self.url}: other writers published first "
                    f"{losses} times in a row over {budget_s:.0f} s")
            if losses % 4 == 0:
                time.sleep(rng.uniform(0.0, min(0.5, 0.02 * losses)))
                current = self.manifest()  # several behind: list again
                continue
            name = self.archive.url_for(self._full(manifest_key(seq)))
            try:
                current = self._read_manifest_settled(seq, name, retry=True)
            except (ArchiveCorrupt, ArchiveNotFound):
                current = self.manifest()
        return None

    def delete_objects(self, keys: Iterable[str]) -> None:
        for key in keys:
            self.archive.delete(self._full(key))

    def compacted_keys(self) -> list[str]:
        """Every compacted segment object under this cluster, referenced or not."""
        return [full[len(self.cluster_id) + 1:]
                for full in self.archive.list_keys(self._full(COMPACTED))]

    def _decode(self, data: bytes, segment: SegmentRecord, name: str) -> list[Entry]:
        entries = decode_segment(data, name=name, cluster_id=self.cluster_id)
        if (entries[0].index, entries[-1].index) != (segment.first, segment.last):
            raise ArchiveCorrupt(
                f"{name} holds entries {entries[0].index}..{entries[-1].index}, not "
                f"{segment.first}..{segment.last} as the manifest says",
                key=name,
            )
        return entries

    def read_segments(self, plan: RestorePlan) -> Iterator[Entry]:
        """The entries `plan` replays after its snapshot, in order, from base + 1 to its index.
        Segments are fetched one at a time; ArchiveCorrupt may come mid-way."""
        return replay(plan, (self.read_segment(segment) for segment in plan.segments))

    def prepare_restore(
        self, work_dir: str | os.PathLike[str], index: int | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> PreparedRestore:
        """Download and verify everything needed to rebuild `index` into `work_dir`, trying
        older snapshots when an object is corrupt or missing. Raises ArchiveCorrupt listing
        every failure when no intact way remains. `progress(bytes_done, bytes_total)` follows
        the downloads."""
        return prepare_restore(self, Path(work_dir), index, progress)

    def fetch_segment(self, segment: SegmentRecord, dest: Path) -> Path:
        """Download one segment to `dest` and verify it whole (SHA-256, records, range)."""
        self.archive.download(self._full(segment.key), dest, expected_sha256=segment.sha256)
        self._decode(dest.read_bytes(), segment, self.location(segment))
        return dest
