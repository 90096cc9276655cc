"""Bootstrap a new cluster's member from an archive (`--restore-from`).

On an empty data dir, every initial member does the same, deterministic work: pick the newest
intact snapshot at or below the requested index (falling back to older snapshots and more
segments past a corrupt object), replay the archived entries up to that index into the state
machine, and write the result as this member's first snapshot at that index, with
`--initial-cluster` as its configuration (term 0: before any term of the new cluster) and the
archived time of that index (the new cluster's entries are stamped no earlier). Every
member thus starts from the same state at the same index, and the new cluster's log continues
right after it, under its own cluster id.

The target is settled first (`open_source`), before the data dir holds anything: the old cluster
in the archive, and the index to rebuild, `--restore-index` or the index `--restore-time`
resolves to (`ClusterArchive.index_at_time`: the last entry stamped at or before it, a pure
function of the log, so every member finds the same one). A target the archive cannot give is
refused then (`OutsideArchive`, exit 4), with nothing written, so the next start finds the data
dir as empty as this one did.

A marker file makes the rest all-or-nothing: a member that crashes mid-restore finds the marker
on its next start and does the restore again (with the same flags) instead of starting empty.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from flotilla.node.archive import (
    Archive,
    ArchiveNotFound,
    ClusterArchive,
    ManifestKeys,
    RestorePlan,
    TimeOutsideArchive,
    format_ms,
    open_archive,
)
from flotilla.node.archive.restore import resolve_cluster_id
from flotilla.node.consensus import EntryKind, Membership, SnapshotMeta
from flotilla.node.statemachine.factory import MachineFactory
from flotilla.node.storage import DiskStorage, SnapshotStore, StorageError
from flotilla.node.storage.datadir import read_identity

from .config import NodeConfig

log = logging.getLogger(__name__)

MARKER = "restore.pending"
PROGRESS = "restore.progress"


class ProgressFile:
    """How far a restore has come, in ``DATA_DIR/restore.progress`` as one JSON object
    ``{"stage": "fetch"|"replay", "done": n, "total": n, "unit": "B"|"entries"}``, for whoever
    started the member (``flotilla up --restore-from`` draws a progress bar from it). Written
    atomically, at most every ``interval`` seconds except at a stage's ends; removed when the
    restore ends, whichever way."""

    def __init__(self, path: Path, interval: float = 0.2) -> None:
        self.path = path
        self.interval = interval
        self._last = 0.0

    def __call__(self, stage: str, done: int, total: int, unit: str) -> None:
        now = time.monotonic()
        if now - self._last < self.interval and 0 < done < total:
            return
        self._last = now
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps({"stage": stage, "done": done, "total": total,
                                   "unit": unit}))
        os.replace(tmp, self.path)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


class OutsideArchive(ArchiveNotFound):
    """The index or time asked for is not one the archive can rebuild (exit 4); the message
    names what it can."""


@dataclass(frozen=True)
class Source:
    """What a restore rebuilds, settled before the data dir is touched: the old cluster's
    archive, the index asked for (None: the newest archived state) and the plan that showed
    the archive can rebuild it. `close()` closes the archive."""

    cluster: ClusterArchive
    index: int | None
    plan: RestorePlan

    def close(self) -> None:
        self.cluster.archive.close()


def wanted(data_dir: Path, cfg: NodeConfig) -> bool:
    """Whether this start restores: `--restore-from` on a data dir without state (no identity
    yet) that bootstraps a new cluster, or one whose restore was interrupted. Asked before the
    data dir is opened, which writes its identity."""
    if not cfg.restore_from:
        return False
    return pending(data_dir) or (read_identity(data_dir) is None
                                 and cfg.initial_cluster_state == "new")


def open_source(cfg: NodeConfig) -> Source:
    """Open `--restore-from` and settle the restore there (see `settle`)."""
    archive = open_archive(cfg.restore_from, endpoint=cfg.s3_endpoint, region=cfg.s3_region)
    try:
        return settle(archive, cluster_id=cfg.restore_cluster_id, excluding=cfg.cluster_id,
                      index=cfg.restore_index, ts_ms=cfg.restore_time, keys=cfg.archive_keys)
    except BaseException:
        archive.close()
        raise


def settle(archive: Archive, *, cluster_id: str | None, excluding: str | None,
           index: int | None = None, ts_ms: int | None = None,
           keys: ManifestKeys | None = None) -> Source:
    """Pick the old cluster in `archive` (`--restore-cluster-id`, else the only one not
    `excluding`) and the index: `index`, or the last one stamped at or before `ts_ms`, or
    the newest. Raises OutsideArchive for an index or time the archive cannot rebuild,
    ArchiveError for a cluster or archive that is not there, ManifestNotAuthentic for a
    manifest that does not verify with `keys` (`--archive-signing-key-file`). `flotilla up`
    calls it too, to refuse a target before it starts any member."""
    old_id = resolve_cluster_id(archive, cluster_id, excluding=excluding)
    cluster = ClusterArchive(archive, old_id, keys=keys)
    flag = "--restore-index"
    if ts_ms is not None:
        flag = "--restore-time"
        try:
            index = cluster.index_at_time(ts_ms)
        except TimeOutsideArchive as exc:
            raise OutsideArchive(f"{flag}: {exc}") from exc
        log.info("--restore-time %s: the last entry of cluster %s stamped at or before it is "
                 "index %d", format_ms(ts_ms), old_id, index)
    try:
        plan = cluster.plan_restore(index)
    except ArchiveNotFound as exc:
        if index is None:
            raise  # nothing archived at all: there was no target to miss
        raise OutsideArchive(f"{flag}: {exc}") from exc
    return Source(cluster, index, plan)


def pending(data_dir: Path) -> bool:
    return (data_dir / MARKER).exists()


def mark(data_dir: Path, cfg: NodeConfig) -> None:
    (data_dir / MARKER).write_text(f"restoring from {cfg.restore_from}\n")


def restore(source: Source, data_dir: Path, snapshots: SnapshotStore, storage: DiskStorage,
            membership: Membership, machines: MachineFactory | None = None) -> SnapshotMeta:
    """Rebuild the state at `source.index` into this member's first snapshot, replaying
    through the machine `machines` makes (default: the key-value machine); returns its
    metadata. Raises ArchiveError (nothing usable in the archive) or StorageError (a
    MachineMismatch when the archive holds another kind of machine's snapshots)."""
    machines = machines or MachineFactory()
    cluster = source.cluster
    work = data_dir / "restore-work"
    progress = ProgressFile(data_dir / PROGRESS)
    try:
        shutil.rmtree(work, ignore_errors=True)
        prepared = cluster.prepare_restore(
            work, source.index, lambda done, total: progress("fetch", done, total, "B"))
        plan = prepared.plan
        log.info("restoring cluster %s from %s: %s", cluster.cluster_id, cluster.url,
                 plan.describe())
        if prepared.snapshot_path is not None:
            with snapshots.open_payload(prepared.snapshot_path) as payload:
                sm = machines.restored(payload)
        else:
            sm = machines.new()
        replayed, to_replay = 0, plan.index - plan.base_index
        progress("replay", 0, to_replay, "entries")
        # The time of the restored index: the new cluster's log goes on from there.
        ts_ms = prepared.snapshot_meta.ts_ms if prepared.snapshot_meta is not None else 0
        for entry in prepared.entries():
            if entry.kind == EntryKind.NORMAL:
                sm.apply(entry.index, entry.data)
            replayed += 1
            ts_ms = entry.ts_ms
            if replayed % 4096 == 0:
                progress("replay", replayed, to_replay, "entries")
        progress("replay", replayed, to_replay, "entries")
        meta = SnapshotMeta(plan.index, 0, membership, ts_ms)
        snapshots.save(meta, sm.kind, sm.write_snapshot)  # nothing applies meanwhile
        storage.install_snapshot(meta)
        log.info("restored the state at index %d, stamped %s (%d entries replayed after the "
                 "snapshot)", plan.index, format_ms(ts_ms) if ts_ms else "at an unknown time",
                 replayed)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        progress.remove()
    (data_dir / MARKER).unlink()
    return meta


def refuse_interrupted(data_dir: Path) -> StorageError:
    return StorageError(
        f"{data_dir / MARKER}: a restore into this data dir was interrupted. Start the member "
        "again with the same --restore-from flags to finish it, or empty the data dir"
    )
