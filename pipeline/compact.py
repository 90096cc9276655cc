"""`flotilla pipeline compact`: Kafka's log compaction, mapped onto a cluster's archive.

The archive is Kafka's log: a *clean* section (compacted segments, `log_start` + 1 up to the
manifest's `cleaned_through`), then a *dirty* section of raw segments, then the head. A pass:

1. **plans** from the manifest alone (`plan_pass`, pure): the cleanable point C is the end of
   the newest raw segment whose last entry is at least `--min-compaction-lag` older, in log
   time, than the newest archived entry; the head after C is never touched. The pass runs
   when the dirty bytes are at least `--min-cleanable-dirty-ratio` of clean plus dirty, or
   when the oldest dirty entry is older than `--max-compaction-lag`.
2. **the snapshot at C**: the one archived there, or one synthesized exactly as
   `snapshot-at` does and added to the cluster: every index from C to the head stays
   restorable from it, and it carries the sessions and the clock past the cleaned section
   (as Kafka keeps producer state).
3. **records**: a record is an *effective* change (a put or a compare-and-set that took
   effect, a delete that removed a key: a delete marker). The last one of each key in the
   dirty section is kept, with the clean section's records of keys the dirty section did not
   change. Entries keep their index and bytes; order never changes.
4. **delete markers** keep for `--delete-retention` after the pass that first cleans them
   (KIP-534's horizon: stored in the compacted segment), and go on the first pass after it.
5. **publishes** one manifest, create-only, rebuilt on top of whatever the archiving leader
   published meanwhile: compacted segments in place of the clean and dirty sections, the
   retention floor at C. Then the objects it replaced are deleted.

Every time is log time (entries' `ts_ms`), never the clock of the machine running the job, so
a rerun of a pass writes the same bytes, and a rerun after a finished pass finds nothing to do.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from flotilla.node.archive import ArchiveError, ClusterArchive, Manifest
from flotilla.node.archive.manifest import SegmentRecord, SnapshotRecord
from flotilla.node.archive.restore import RestorePlan, resolve_cluster_id
from flotilla.node.consensus import Entry, EntryKind

from .kvfold import OP_DELETE, decode_fields
from .source import ArchiveRef
from .spark import PipelineError

__all__ = ["CompactionPolicy", "PassPlan", "compact", "parse_duration", "plan_pass"]

DAY_MS = 24 * 3600 * 1000
MAX_RECORDS = 10_000  # entries a compacted segment keeps at most (the raw segments' default)
_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": DAY_MS}
_DURATION = re.compile(r"(\d+)(ms|s|m|h|d)")
MAX_DURATION_MS = 100 * 365 * DAY_MS


def parse_duration(text: str) -> int:
    """`24h`, `30m`, `0s`, `1h30m`, `500ms`, `7d` as milliseconds (ValueError otherwise)."""
    if not text or _DURATION.sub("", text):
        raise ValueError(f"{text!r} is not a duration: use a number and a unit (ms, s, m, h, "
                         "d), like 24h, 30m, 0s or 1h30m")
    total = sum(int(n) * _UNITS[unit] for n, unit in _DURATION.findall(text))
    if total > MAX_DURATION_MS:
        raise ValueError(f"{text!r} is longer than 100 years")
    return total


@dataclass(frozen=True, slots=True)
class CompactionPolicy:
    """Kafka's settings, in log-time milliseconds (its defaults, but max lag: none)."""

    min_lag_ms: int = 0
    delete_retention_ms: int = DAY_MS
    min_dirty_ratio: float = 0.5
    max_lag_ms: int | None = None

    def __post_init__(self) -> None:
        if not 0 < self.min_dirty_ratio <= 1:
            raise ValueError(f"--min-cleanable-dirty-ratio {self.min_dirty_ratio} is outside "
                             "(0, 1]: 0.5 cleans when half the bytes are dirty")
        if self.max_lag_ms is not None and self.max_lag_ms < self.min_lag_ms:
            raise ValueError("--max-compaction-lag is shorter than --min-compaction-lag: "
                             "nothing could ever be forced")


@dataclass(frozen=True, slots=True)
class PassPlan:
    """What one pass cleans: the dirty raw segments after `base` up to `through` (C), on top
    of the clean section's compacted segments."""

    base: int  # the state the dirty section applies to: `prev`'s snapshot, or the oldest base
    through: int  # C, the cleanable point
    prev: int  # the manifest's cleaned_through before this pass
    head: int  # the newest archived index
    now_ms: int  # the log time of `head`: the pass's "now"
    dirty: tuple[SegmentRecord, ...]
    clean: tuple[SegmentRecord, ...]
    snapshot: SnapshotRecord | None  # archived at C already (else synthesized)
    base_snapshot: SnapshotRecord | None  # at `base` (None: the empty state)
    log_start: int
    dirty_ratio: float
    forced: bool  # by --max-compaction-lag

    @property
    def dirty_bytes(self) -> int:
        return sum(s.size for s in self.dirty)

    @property
    def clean_bytes(self) -> int:
        return sum(s.size for s in self.clean)


@dataclass(frozen=True, slots=True)
class Skip:
    """Why a pass does nothing now."""

    reason: str
    cleaned_through: int
    dirty_ratio: float | None = None


def _time(value: int | None) -> int:
    return value or 0  # unknown (entries written before they carried a time): the oldest


def plan_pass(manifest: Manifest, policy: CompactionPolicy) -> PassPlan | Skip:
    prev = manifest.cleaned_through
    head = manifest.last_archived_index
    if head == 0:
        return Skip("nothing is archived yet", prev)
    bases = [b for b in manifest.bases() if b >= prev and manifest.reach(b) == head]
    if not bases:
        return Skip(f"no snapshot at or after index {prev} reaches the newest archived "
                    f"index {head} through raw segments", prev)
    base = bases[0]
    chain = manifest.chain(base, head) or ()
    now = max([_time(s.last_ts_ms) for s in chain]
              + [_time(s.ts_ms) for s in manifest.snapshots if s.index == head])
    old_enough = [s.last for s in chain if _time(s.last_ts_ms) <= now - policy.min_lag_ms]
    through = max(old_enough, default=0)
    if through <= max(prev, base):
        return Skip(f"no raw segment after index {max(prev, base)} is older than "
                    f"--min-compaction-lag in log time", prev)
    dirty = manifest.chain(base, through) or ()
    clean = manifest.compacted_segments
    dirty_bytes = sum(s.size for s in dirty)
    ratio = dirty_bytes / (dirty_bytes + sum(s.size for s in clean))
    forced = (policy.max_lag_ms is not None
              and _time(dirty[0].first_ts_ms) <= now - policy.max_lag_ms)
    if ratio < policy.min_dirty_ratio and not forced:
        return Skip(f"the dirty ratio {ratio:.3f} is below --min-cleanable-dirty-ratio "
                    f"{policy.min_dirty_ratio}", prev, ratio)
    snapshots = {s.index: s for s in manifest.snapshots}
    return PassPlan(base, through, prev, head, now, tuple(dirty), clean,
                    snapshots.get(through), snapshots.get(base),
                    manifest.log_start if prev else base, ratio, forced)


@dataclass
class CompactionResult:
    cluster_id: str
    cleaned_through: int
    entries_before: int = 0
    entries_after: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    bytes_read: int = 0
    dirty_ratio: float | None = None
    snapshot: str | None = None  # the snapshot at the cleanable point
    synthesized: bool = False
    markers: int = 0  # delete markers kept
    markers_removed: int = 0  # past their horizon, removed by this pass
    deleted: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        document = {"cluster_id": self.cluster_id, "cleaned_through": self.cleaned_through,
                    "entries_before": self.entries_before, "entries_after": self.entries_after,
                    "bytes_before": self.bytes_before, "bytes_after": self.bytes_after,
                    "bytes_read": self.bytes_read, "dirty_ratio": self.dirty_ratio,
                    "snapshot": self.snapshot, "synthesized": self.synthesized,
                    "markers": self.markers, "markers_removed": self.markers_removed,
                    "objects_deleted": len(self.deleted)}
        return json.dumps(document)


@dataclass(frozen=True, slots=True)
class _Range:
    """A stretch of the compacted log: an old compacted segment, or a dirty raw segment's
    part after the base, and what the pass keeps of it."""

    first: int
    last: int
    times: tuple[int | None, int | None]
    kept: list[Entry]
    horizons: dict[int, int]
    unchanged: SegmentRecord | None  # an old compacted segment that loses nothing


@dataclass(frozen=True, slots=True)
class Prepared:
    """A checked pass: the cluster resolved and the plan made from its manifest, before Spark
    starts (`plan` is a Skip when there is nothing to do)."""

    ref: ArchiveRef
    plan: PassPlan | Skip

    def describe(self) -> str:
        return describe(self.ref.cluster_id, self.plan)


def prepare(ref: ArchiveRef, policy: CompactionPolicy) -> Prepared:
    """Resolve the cluster `ref` names and plan a pass from its newest manifest."""
    archive = ref.open()
    try:
        cluster_id = resolve_cluster_id(archive, ref.cluster_id, id_flag="--cluster-id",
                                        url_flag="--archive")
        manifest = ref.cluster(archive, cluster_id).manifest()
        if manifest is None:
            raise PipelineError(f"{ref.url} holds no manifest for cluster {cluster_id!r}: "
                                "nothing was archived yet")
        ref = replace(ref, cluster_id=cluster_id)
        return Prepared(ref, plan_pass(manifest, policy))
    except ArchiveError as exc:
        raise PipelineError(f"cannot compact {ref.url}: {exc}") from None
    finally:
        archive.close()


def compact(spark: Any, ref: ArchiveRef, policy: CompactionPolicy, *, sequential: bool = False,
            prepared: Prepared | None = None) -> CompactionResult | Skip:
    """One compaction pass over the cluster `ref` names (or the one `prepared` planned).
    `sequential`: the node's own machine replays the dirty section in one process (the
    oracle) instead of Spark's parallel fold."""
    job = prepared or prepare(ref, policy)
    if isinstance(job.plan, Skip):
        return job.plan
    ref = job.ref
    archive = ref.open()
    try:
        cluster = ref.cluster(archive)
        return _run(spark, ref, cluster, job.plan, policy, sequential)
    except ArchiveError as exc:
        raise PipelineError(f"cannot compact {ref.url}: {exc}") from None
    finally:
        archive.close()


def _run(spark: Any, ref: ArchiveRef, cluster: ClusterArchive, plan: PassPlan,
         policy: CompactionPolicy, sequential: bool) -> CompactionResult:
    result = CompactionResult(cluster.cluster_id, plan.through,
                              dirty_ratio=round(plan.dirty_ratio, 6))
    dirty_plan = RestorePlan(plan.through, plan.base_snapshot, plan.dirty)
    with tempfile.TemporaryDirectory(prefix="flotilla-compact-") as work:
        if sequential:
            from .replay import replay_snapshot

            path, meta = replay_snapshot(spark, ref, dirty_plan, "kv", Path(work))
            changed = last_changes_by_replay(ref, dirty_plan)
            wanted = {index for index, _ in changed.values()}
            kept_entries = [e for e in cluster.read_segments(dirty_plan) if e.index in wanted]
            result.bytes_read += 2 * _plan_bytes(dirty_plan)
        else:
            from .snapshot_at import state_and_changes

            cleaned = state_and_changes(spark, ref, dirty_plan, Path(work))
            path, meta, changed, kept_entries = (cleaned.path, cleaned.meta, cleaned.last,
                                                 cleaned.entries)
        result.bytes_read += _plan_bytes(dirty_plan)
        snapshot = plan.snapshot
        if snapshot is None:  # the cleanable point's snapshot: this one
            snapshot = cluster.upload_snapshot(path, meta)
            result.synthesized = True
    result.snapshot = cluster.location(snapshot)

    ranges: list[_Range] = []
    for segment in plan.clean:
        header, entries = cluster.read_compacted(segment)
        result.bytes_read += segment.size
        kept, horizons = [], {}
        for entry in entries:
            fields = decode_fields(entry.data)
            if fields is None or fields[1] in changed:
                continue  # superseded by a newer record of its key
            horizon = header.horizons.get(entry.index)
            if horizon is not None:
                if horizon <= plan.now_ms:
                    result.markers_removed += 1
                    continue
                horizons[entry.index] = horizon
            kept.append(entry)
        same = len(kept) == len(entries)
        ranges.append(_Range(segment.first, segment.last,
                             (segment.first_ts_ms, segment.last_ts_ms), kept, horizons,
                             segment if same else None))
    ops = dict(changed.values())  # index -> op of each key's last change
    horizon = plan.now_ms + policy.delete_retention_ms
    position = 0
    covered = plan.base
    for segment in plan.dirty:  # consecutive; a chain's segments may overlap
        low = covered + 1
        kept = []
        while position < len(kept_entries) and kept_entries[position].index <= segment.last:
            kept.append(kept_entries[position])
            position += 1
        ranges.append(_Range(low, segment.last, (segment.first_ts_ms, segment.last_ts_ms),
                             kept, {e.index: horizon for e in kept
                                    if ops[e.index] == OP_DELETE}, None))
        covered = segment.last
    if position != len(kept_entries) or len(kept_entries) != len(ops):
        raise PipelineError(f"the fold kept {len(ops)} changes but {len(kept_entries)} of "
                            "their entries came back: the dirty section was read wrong")

    records = [_write(cluster, group, plan.through) for group in _groups(ranges)]
    result.entries_before = sum(s.entries or 0 for s in plan.clean) + plan.through - plan.base
    result.entries_after = sum(r.entries or 0 for r in records)
    result.bytes_before = plan.clean_bytes + plan.dirty_bytes
    result.bytes_after = sum(r.size for r in records)
    result.markers = sum(len(r.horizons) for r in ranges)

    replaced: set[str] = set()

    def build(current: Manifest) -> Manifest | None:
        if current.cleaned_through != plan.prev or current.compacted_segments != plan.clean:
            raise PipelineError(
                f"another compaction of {cluster.url} published while this one ran (it now "
                f"reaches index {current.cleaned_through}): run one compaction at a time; "
                "rerun this one to continue from there")
        replaced.clear()
        replaced.update(s.key for s in current.segments
                        if s.compacted or s.last <= plan.through)
        replaced.update(s.key for s in current.snapshots
                        if s.index < plan.through and s.index != plan.log_start)
        segments = [s for s in current.segments if not s.compacted and s.last > plan.through]
        snapshots = [*current.snapshots, snapshot]
        return Manifest.create(cluster.cluster_id, 0, "", snapshots, [*segments, *records],
                               max(current.retention_floor, plan.through), plan.through,
                               plan.log_start)

    published = cluster.publish_built(build)
    assert published is not None  # the plan came from a manifest
    referenced = {s.key for s in published.segments} | {s.key for s in published.snapshots}
    doomed = sorted((replaced - referenced)
                    | {key for key in cluster.compacted_keys() if key not in referenced})
    cluster.delete_objects(doomed)
    result.deleted = doomed
    return result


def _plan_bytes(plan: RestorePlan) -> int:
    return (plan.snapshot.size if plan.snapshot else 0) + sum(s.size for s in plan.segments)


def _groups(ranges: Sequence[_Range]) -> Iterable[list[_Range]]:
    """Consecutive ranges merged into compacted segments of at most MAX_RECORDS entries (an
    old segment that loses nothing and fills one on its own stays as it is)."""
    group: list[_Range] = []
    count = 0
    for r in ranges:
        if group and count + len(r.kept) > MAX_RECORDS:
            yield group
            group, count = [], 0
        group.append(r)
        count += len(r.kept)
    if group:
        yield group


def _write(cluster: ClusterArchive, group: list[_Range], through: int) -> SegmentRecord:
    if len(group) == 1 and group[0].unchanged is not None:
        return group[0].unchanged
    kept = [e for r in group for e in r.kept]
    horizons = {i: h for r in group for i, h in r.horizons.items()}
    return cluster.upload_compacted(group[0].first, group[-1].last, through, kept, horizons,
                                    (group[0].times[0], group[-1].times[1]))


def last_changes_by_replay(ref: ArchiveRef, plan: RestorePlan) -> dict[bytes, tuple[int, int]]:
    """The last effective change of each key, by the node's own machine, one entry at a time
    (the oracle; and `--sequential`): a change is whatever alters a key's (value, mod index)."""
    from flotilla.node.statemachine.kv import KVStateMachine
    from flotilla.node.storage import PayloadReader

    from .source import cluster_archive

    cluster = cluster_archive(ref)
    machine = KVStateMachine()
    if plan.snapshot is not None:
        with tempfile.TemporaryDirectory(prefix="flotilla-compact-") as work:
            path = Path(work) / "base.snap"
            cluster.download_snapshot(plan.snapshot, path)
            with PayloadReader(path) as payload:
                machine.restore(payload)
    changed: dict[bytes, tuple[int, int]] = {}
    for entry in cluster.read_segments(plan):
        if entry.kind != EntryKind.NORMAL:
            continue
        fields = decode_fields(entry.data)
        if fields is None:
            machine.apply(entry.index, entry.data)
            continue
        key = fields[1].decode("utf-8", "surrogatepass")
        before = machine.get(key)
        machine.apply(entry.index, entry.data)
        if machine.get(key) != before:
            changed[fields[1]] = (entry.index, fields[0])
    return changed


def describe(cluster_id: str, plan: PassPlan | Skip) -> str:
    if isinstance(plan, Skip):
        return json.dumps({"cluster_id": cluster_id, "cleaned_through": plan.cleaned_through,
                           "skipped": plan.reason, "dirty_ratio": plan.dirty_ratio})
    return json.dumps({
        "cluster_id": cluster_id, "base": plan.base, "cleaned_through": plan.prev,
        "cleanable_point": plan.through, "head": plan.head, "log_time_ms": plan.now_ms,
        "dirty_segments": len(plan.dirty), "dirty_bytes": plan.dirty_bytes,
        "clean_segments": len(plan.clean), "clean_bytes": plan.clean_bytes,
        "dirty_ratio": round(plan.dirty_ratio, 6), "forced": plan.forced,
        "snapshot": plan.snapshot.key if plan.snapshot else "synthesized"})
