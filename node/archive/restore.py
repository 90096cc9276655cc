"""Restoring from an archive: choosing a snapshot and segments, and working around damage.

`plan_candidates` (pure) lists every way to rebuild the state at an index from a manifest,
newest snapshot first: each later candidate starts from an older snapshot and replays more
segments, which is exactly what is needed when the newer snapshot turns out to be corrupt or
missing. `prepare_restore` walks those candidates, downloading and verifying into a work
directory, and remembers which objects failed so no candidate that needs one is tried again.
`list_clusters` and `resolve_cluster_id` serve `--restore-cluster-id`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from flotilla.node.consensus.types import EMPTY_MEMBERSHIP, Entry, SnapshotMeta
from flotilla.node.storage.snapshots import snapshot_name

from .errors import ArchiveCorrupt, ArchiveError, ArchiveNotFound
from .layout import MANIFESTS, check_cluster_id
from .manifest import Manifest, SegmentRecord, SnapshotRecord
from .protocol import Archive
from .segments import decode_segment

if TYPE_CHECKING:
    from .cluster import ClusterArchive

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RestorePlan:
    """How to rebuild the state at `index`: install `snapshot` (None: start from the empty
    state), then apply the entries of `segments` from the snapshot's index + 1 to `index`."""

    index: int
    snapshot: SnapshotRecord | None
    segments: tuple[SegmentRecord, ...]

    @property
    def base_index(self) -> int:
        return self.snapshot.index if self.snapshot else 0

    def describe(self) -> str:
        start = f"snapshot {self.snapshot.key}" if self.snapshot else "the empty state"
        return f"{start} + {len(self.segments)} segment(s) up to index {self.index}"


@dataclass(frozen=True, slots=True)
class PreparedRestore:
    """Verified local copies of what a restore needs (from `prepare_restore`)."""

    plan: RestorePlan
    cluster_id: str
    snapshot_path: Path | None  # named as SnapshotStore names it; None: start empty
    snapshot_meta: SnapshotMeta | None
    segment_paths: tuple[Path, ...]

    def entries(self) -> Iterator[Entry]:
        """The entries to apply after the snapshot, base + 1 .. plan.index, in order."""
        return replay(
            self.plan,
            (decode_segment(path.read_bytes(), name=str(path), cluster_id=self.cluster_id)
             for path in self.segment_paths),
        )


def plan_candidates(manifest: Manifest, index: int | None, url: str) -> list[RestorePlan]:
    """Every plan that rebuilds `index` (None: the newest archived state) from `manifest`,
    newest snapshot first; ArchiveNotFound, saying which indexes can be rebuilt, if none."""
    if index is not None and index < 1:
        raise ValueError("a restore index is at least 1")
    newest = manifest.last_archived_index
    target = newest if index is None else index
    if target == 0:
        raise ArchiveNotFound(f"{url} holds no snapshot or segment yet: nothing to restore")
    if target > newest:
        raise ArchiveNotFound(
            f"index {target} is beyond what {url} holds (newest archived index {newest}); "
            f"pick --restore-index {newest} or lower, or omit it for the newest state"
        )
    snapshots = {s.index: s for s in manifest.snapshots}
    plans = []
    for base in reversed(manifest.bases()):
        if base <= target and (chain := manifest.chain(base, target)) is not None:
            plans.append(RestorePlan(target, snapshots.get(base), chain))
    if plans:
        return plans
    oldest = manifest.snapshots[0].index if manifest.snapshots else None
    why = (
        f"it is older than the oldest kept snapshot (index {oldest}); retention removed the "
        "history before it"
        if oldest is not None and target < oldest
        else "it falls in a gap of the archive"
    )
    ranges = ", ".join(f"{low}..{high}" for low, high in manifest.restorable_ranges())
    raise ArchiveNotFound(
        f"index {target} cannot be rebuilt from {url}: {why}; restorable indexes are {ranges}"
    )


def replay(plan: RestorePlan, segments: Iterable[list[Entry]]) -> Iterator[Entry]:
    """Entries base+1..plan.index from the plan's consecutive (possibly overlapping)
    segments."""
    next_index = plan.base_index + 1
    for entries in segments:
        for entry in entries:
            if entry.index > plan.index:
                return
            if entry.index == next_index:
                yield entry
                next_index += 1
    if next_index != plan.index + 1:
        raise ArchiveCorrupt(
            f"the segments of the restore plan ({plan.describe()}) stop at index "
            f"{next_index - 1}"
        )


def prepare_restore(cluster: ClusterArchive, work: Path, index: int | None,
                    progress: Callable[[int, int], None] | None = None) -> PreparedRestore:
    """See `ClusterArchive.prepare_restore`. `progress(bytes_done, bytes_total)` is called
    after each object a plan needs is in place (the total is the plan's, so it can grow when
    a corrupt object sends the restore to an older snapshot)."""
    (work / "segments").mkdir(parents=True, exist_ok=True)
    bad: dict[str, ArchiveError] = {}  # key -> why it cannot be used
    fetched: dict[str, Path] = {}  # verified segment files, shared by the candidates
    failures: list[str] = []
    plans = cluster.restore_candidates(index)
    report = progress or (lambda _done, _total: None)
    for plan in plans:
        snapshot_path = meta = None
        total = (plan.snapshot.size if plan.snapshot else 0) + sum(s.size for s in plan.segments)
        done = 0
        report(done, total)
        try:
            if plan.snapshot is not None:
                snapshot = plan.snapshot
                snapshot_path = work / snapshot_name(
                    SnapshotMeta(snapshot.index, snapshot.term, EMPTY_MEMBERSHIP)
                )
                meta = _once(snapshot.key, bad, cluster.download_snapshot, snapshot,
                             snapshot_path)
                done += snapshot.size
                report(done, total)
            for segment in plan.segments:
                if segment.key not in fetched:
                    dest = work / "segments" / Path(segment.key).name
                    fetched[segment.key] = _once(
                        segment.key, bad, cluster.fetch_segment, segment, dest
                    )
                done += segment.size
                report(done, total)
        except (ArchiveCorrupt, ArchiveNotFound) as exc:
            if snapshot_path is not None:
                snapshot_path.unlink(missing_ok=True)
            log.warning("cannot restore from %s: %s", plan.describe(), exc)
            failures.append(f"{plan.describe()}: {exc}")
            continue
        if plan is not plans[0]:
            log.warning("restoring from an older snapshot instead: %s", plan.describe())
        paths = tuple(fetched[segment.key] for segment in plan.segments)
        return PreparedRestore(plan, cluster.cluster_id, snapshot_path, meta, paths)
    raise ArchiveCorrupt(
        f"no intact way to rebuild index {plans[0].index} from {cluster.url} remains ("
        + "; ".join(failures)
        + "); pick another --restore-index, or repair the archive from a member that still "
        "holds the data"
    )


def _once(key: str, bad: dict[str, ArchiveError], fetch: Callable[..., T], *args) -> T:
    """`fetch(*args)` for object `key`, unless it already failed; remember a failure."""
    if key in bad:
        raise bad[key]
    try:
        return fetch(*args)
    except (ArchiveCorrupt, ArchiveNotFound) as exc:
        bad[key] = exc
        raise


def list_clusters(archive: Archive) -> list[str]:
    """The ids of the clusters with at least one manifest in `archive`."""
    found = []
    for name in archive.list_prefixes(""):
        try:
            check_cluster_id(name)
        except ValueError:
            continue
        if next(iter(archive.list_keys(f"{name}/{MANIFESTS}")), None) is not None:
            found.append(name)
    return found


def resolve_cluster_id(archive: Archive, cluster_id: str | None = None, *,
                       excluding: str | None = None, id_flag: str = "--restore-cluster-id",
                       url_flag: str = "--restore-from") -> str:
    """The cluster to restore: `cluster_id` if given and present, else the only one there
    (the `--restore-cluster-id` default), not counting `excluding` (the restoring cluster's
    own id: a restored cluster may already archive beside the one it came from). Errors name
    the caller's flags."""
    clusters = [c for c in list_clusters(archive) if c != excluding or c == cluster_id]
    if cluster_id is not None:
        if cluster_id not in clusters:
            raise ArchiveNotFound(
                f"{archive.url} holds no cluster {cluster_id!r} (it holds: "
                f"{', '.join(clusters) or 'none'}); check {id_flag}"
            )
        return cluster_id
    if not clusters:
        raise ArchiveNotFound(
            f"{archive.url} holds no archived cluster; check the {url_flag} URL (and "
            "--s3-endpoint)"
        )
    if len(clusters) > 1:
        raise ArchiveError(
            f"{archive.url} holds several clusters ({', '.join(clusters)}); pick one with "
            f"{id_flag}"
        )
    return clusters[0]
