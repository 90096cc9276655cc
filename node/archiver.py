"""The leader's archiver: ships every snapshot and every committed entry to the archive.

Only the leader ships. On taking office it reads the newest manifest and resumes after the
last archived index, so a new leader neither repeats nor skips what an old one shipped.

Before it ships anything it checks that the archive holds this cluster's history: the term the
archive records for its last archived entry must be the term its own log holds at that index
(Log Matching: then every entry before it agrees too). A mismatch, or an archive that runs past
its log, means the archive holds entries this cluster never committed (forged, or another
cluster's under the same id): it ships nothing, logs an ERROR naming the index and both terms,
and reports it in `/v1/status` (and `flotilla_archive_errors_total`) until that is resolved.
The check waits until the leader has committed an entry of its own term: before that, a
deposed leader that has not heard of its successor could take the newer archive for a foreign
one.

A round (every `--archive-interval-ms`, or at once when a snapshot is taken or a full segment
of committed entries is waiting):

1. a snapshot newer than the archive's newest is uploaded, a manifest published, and old
   snapshots and the segments only they needed are trimmed (`--archive-keep-snapshots`);
2. committed entries after the last archived index leave as segments of at most
   `--archive-segment-entries`, each published by a manifest.

Entries the archive does not have yet are kept in the log whatever the snapshots cover (see
`retain_after`), so an archive that is unreachable for a while is filled later with no gap.
Every upload runs in a worker thread; failures are logged, counted, shown in `/v1/status`,
and retried with backoff while the cluster keeps serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Protocol

from flotilla.node.archive import (
    ArchiveDiverged,
    ArchiveError,
    ArchiveSettings,
    ClusterArchive,
    Manifest,
    ManifestNotAuthentic,
    SnapshotRecord,
)
from flotilla.node.consensus import Entry
from flotilla.node.storage import StorageError, StoredSnapshot

from .status import ArchiveView

if TYPE_CHECKING:
    from .config import NodeConfig


class ArchiveSource(Protocol):
    """What the archiver reads of its member (node.Node): the core's facts, the log on disk
    and the newest snapshot file."""

    def is_leader(self) -> bool: ...

    def term(self) -> int: ...

    def commit_index(self) -> int: ...

    def log_span(self) -> tuple[int, int]:
        """The first and last index of the log in memory."""
        ...

    def term_at(self, index: int) -> int | None: ...

    def stored_first_index(self) -> int: ...

    def stored_entries(self, lo: int, hi: int) -> list[Entry]: ...

    def latest_snapshot(self) -> StoredSnapshot | None: ...

log = logging.getLogger(__name__)

MAX_BACKOFF = 10.0
# The node's archive requests give up sooner than the library's defaults, so an unreachable
# store is reported (status, logs) within seconds and retried by the archiver's own loop.
NODE_ARCHIVE_SETTINGS = ArchiveSettings(max_attempts=3, connect_timeout=2.0, read_timeout=5.0)


class Archiver:
    def __init__(self, node: ArchiveSource, cluster: ClusterArchive, cfg: NodeConfig) -> None:
        self.node = node
        self.cluster = cluster
        self.keep_snapshots = cfg.archive_keep_snapshots
        self.interval = cfg.archive_interval_ms / 1000
        self.segment_entries = cfg.archive_segment_entries
        self.last_archived_index = 0
        self.last_snapshot_index = 0
        self.error: str | None = None
        self.uploads = {"snapshot": 0, "segment": 0}
        self.failures = 0
        self._resumed_term: int | None = None  # the term whose leader read the manifest
        # The index of the archive's last entry when it was found not to be this cluster's:
        # the log keeps it, so that every later check (after a restart too) can compare it.
        self._diverged_at: int | None = None
        self._wakeup = asyncio.Event()
        self._busy = asyncio.Lock()  # one round at a time: the loop's or a requested one
        self._task: asyncio.Task | None = None
        self._round_started: float | None = None

    # --- control -------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await asyncio.to_thread(self.cluster.archive.close)

    def poke(self) -> None:
        """Something worth shipping now: a snapshot, or a full segment of committed entries."""
        self._wakeup.set()

    def committed(self, commit_index: int) -> None:
        """Called by the runtime as the commit index moves; wakes a round for a full segment."""
        if (self._resumed_term is not None
                and commit_index - self.last_archived_index >= self.segment_entries):
            self._wakeup.set()

    def retain_after(self) -> int | None:
        """The highest index the log may forget: entries after it are not archived yet (or,
        while the archive is not this cluster's history, the entry that shows it). None when
        this member does not ship (it is not the leader)."""
        if not self.node.is_leader():
            return None
        if self._resumed_term is None:
            return None if self._diverged_at is None else self._diverged_at - 1
        return self.last_archived_index

    async def ship_now(self, index: int, term: int) -> str | None:
        """Run a round now (POST /v1/snapshot) and return where snapshot (index, term) is
        archived, or None when this member does not ship (a follower). Raises ArchiveError
        when the archive cannot be reached."""
        if not self.node.is_leader():
            return None
        async with self._busy:
            await self._round()
        record = self.archived_snapshot(index, term)
        return self.cluster.location(record) if record is not None else None

    def archived_snapshot(self, index: int, term: int) -> SnapshotRecord | None:
        """The archive's record of snapshot (index, term) if the newest manifest this member
        read or published lists it (no I/O)."""
        manifest = self.cluster.cached_manifest
        for record in manifest.snapshots if manifest is not None else ():
            if record.index == index and record.term == term:
                return record
        return None

    def status(self) -> ArchiveView:
        error = self.error
        started = self._round_started
        if error is None and started is not None:
            running = time.monotonic() - started
            if running > max(5.0, 2 * self.interval):
                error = (f"an archiving round has been waiting on {self.cluster.url} for "
                         f"{running:.0f}s (slow or unreachable)")
        return ArchiveView(self.cluster.url, self.last_snapshot_index,
                           self.last_archived_index, error)

    # --- the loop ------------------------------------------------------------------------

    async def _run(self) -> None:
        backoff = 0.0
        while True:
            delay = backoff or self.interval
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._wakeup.wait()
            self._wakeup.clear()
            if not self.node.is_leader():
                self._resumed_term = None
                continue
            try:
                async with self._busy:
                    await self._round()
            except (ArchiveError, StorageError, OSError, ValueError) as exc:
                self.failures += 1
                self.error = f"{type(exc).__name__}: {exc}"
                backoff = min(MAX_BACKOFF, max(self.interval / 4, backoff * 2 or 0.5))
                # Not a passing fault: the archive is not what this cluster wrote.
                alarming = isinstance(exc, ArchiveDiverged | ManifestNotAuthentic)
                level = logging.ERROR if alarming else logging.WARNING
                log.log(level, "archiving to %s failed (retrying in %.1fs): %s",
                        self.cluster.url, backoff, self.error)
            else:
                if self.error is not None:
                    log.info("archiving to %s works again", self.cluster.url)
                self.error = None
                backoff = 0.0

    async def _round(self) -> None:
        node = self.node
        term = node.term()
        self._round_started = time.monotonic()
        try:
            if self._resumed_term != term:
                if node.term_at(node.commit_index()) != term:
                    # Not known to lead yet (a deposed leader may not have heard): its log
                    # is compared with the archive once it has committed in its own term.
                    return
                manifest = await asyncio.to_thread(self.cluster.manifest)
                await self._check_history(manifest)
                self._adopt(manifest)
                self._resumed_term = term
                log.info("archiving to %s from index %d (newest archived snapshot %d)",
                         self.cluster.url, self.last_archived_index + 1,
                         self.last_snapshot_index)
            # Uploads of an earlier round whose manifest could not be written: publish them
            # first (no I/O when nothing is pending), or they would block what follows.
            self._adopt(await asyncio.to_thread(self.cluster.publish))
            if self.last_archived_index + 1 >= self.node.stored_first_index():
                # Entries first: a snapshot shipped before them would move the archive past
                # entries it never got (restores to those indexes would be impossible).
                await self._ship_entries()
                await self._ship_snapshot()
            else:
                # The log no longer holds what follows the archive (this member compacted it
                # before it led): the snapshot is the only way on.
                await self._ship_snapshot()
                await self._ship_entries()
        finally:
            self._round_started = None

    async def _check_history(self, manifest: Manifest | None) -> None:
        """Raise ArchiveDiverged unless the archive's last archived entry has the term this
        member's log holds at its index. When the log no longer holds that index (this member
        compacted it before it led), only the rule that terms never decrease along a log is
        left to check it by; then shipping goes on from the snapshot, with a WARNING."""
        if manifest is None or manifest.last_archived_index == 0:
            return
        index = manifest.last_archived_index
        archived = await asyncio.to_thread(self.cluster.last_archived_term, manifest)
        node = self.node
        first, last = node.log_span()
        start = first - 1  # the snapshot the log starts after
        own = node.term_at(index)
        url = self.cluster.url
        if index > last:
            found = (f"{url} holds entries up to index {index} (term {archived}), beyond this "
                     f"leader's log, which ends at index {last}")
        elif own is not None and own != archived:
            found = (f"the last archived entry of {url}, index {index}, has term {archived} in "
                     f"the archive but term {own} in this leader's log")
        elif own is None and archived is not None and archived > node.term_at(start):
            found = (f"the last archived entry of {url}, index {index}, has term {archived}, "
                     f"later than the term {node.term_at(start)} this leader's log holds after "
                     f"it at index {start} (terms never decrease along a log)")
        else:
            self._diverged_at = None
            if own is None:
                log.warning("cannot fully check that %s holds this cluster's history: its "
                            "last entry, index %d, is compacted out of this member's log",
                            self.cluster.url, index)
            return
        self._diverged_at = index
        raise ArchiveDiverged(
            f"{found}: the archive holds a history this cluster did not "
            "commit (forged, or another cluster's under the same --cluster-id). Nothing is "
            "shipped until it is resolved: move that cluster's objects aside (or point "
            "--archive elsewhere) and restart this member")

    async def _ship_snapshot(self) -> None:
        stored = self.node.latest_snapshot()
        if stored is None or stored.meta.index <= self.last_snapshot_index:
            return  # nothing newer (the bootstrap snapshot at 0 is never shipped)
        if (self.last_archived_index < stored.meta.index
                and self.last_archived_index + 1 >= self.node.stored_first_index()):
            # Taken while the entries before it were uploading (they went up to the commit
            # index of then): those entries first, or the archive would move past them.
            await self._ship_entries()
            if self.last_archived_index < stored.meta.index:
                return  # no longer the leader: whoever leads next ships them
        await asyncio.to_thread(self.cluster.upload_snapshot, stored.path, stored.meta)
        self._adopt(await asyncio.to_thread(self.cluster.publish))
        self.uploads["snapshot"] += 1
        log.info("archived snapshot %d", stored.meta.index)
        result = await asyncio.to_thread(self.cluster.retain, self.keep_snapshots)
        if result.deleted:
            log.info("archive retention removed %d object(s)", len(result.deleted))

    async def _ship_entries(self) -> None:
        node = self.node
        commit = node.commit_index()  # what is committed now: a round ends under load
        while True:
            first = self.last_archived_index + 1
            if first > commit:
                return
            if first < node.stored_first_index():
                # Compacted before it was shipped (this member was not the archiving leader
                # then): the next snapshot covers it, and shipping resumes from there.
                raise ArchiveError(
                    f"entries from {first} are no longer in this member's log (it starts at "
                    f"{node.stored_first_index()}); the archive resumes after the next snapshot"
                )
            last = min(commit, first + self.segment_entries - 1)
            entries = node.stored_entries(first, last + 1)
            await asyncio.to_thread(self.cluster.upload_segment, entries)
            self._adopt(await asyncio.to_thread(self.cluster.publish))
            self.uploads["segment"] += 1
            if not self.node.is_leader():
                return

    def _adopt(self, manifest: Manifest | None) -> None:
        if manifest is None:
            return
        self.last_archived_index = manifest.last_archived_index
        newest = manifest.last_snapshot
        self.last_snapshot_index = newest.index if newest is not None else 0
