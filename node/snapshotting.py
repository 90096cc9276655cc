"""A member's snapshots: taking them (by policy or on request) without stopping applies,
receiving them from a leader (streamed, or fetched from the archive), installing them, and
serving the newest one to followers.

Every snapshot that came from elsewhere is restored into a fresh machine before it replaces
anything: one that does not restore is refused (`SnapshotRefused`) and the member keeps what it
had. The newest snapshot file is verified once (written, received or loaded at start) and
remembered here; nothing looks for it again per request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flotilla.node.archive import ArchiveError, SnapshotRecord
from flotilla.node.consensus import Entry, Message, Snapshot
from flotilla.node.statemachine import StateMachine
from flotilla.node.statemachine.factory import MachineFactory
from flotilla.node.statemachine.store import snapshot_into_store
from flotilla.node.storage import SnapshotStore, StorageError, StoredSnapshot
from flotilla.node.storage.space import disk_full

from .snapshot_policy import SnapshotPolicy
from .transport import SNAPSHOT_KEY_HEADER, SNAPSHOT_SHA_HEADER, SNAPSHOT_SIZE_HEADER

if TYPE_CHECKING:
    from .runtime import Runtime

log = logging.getLogger(__name__)

#: How long a requested snapshot waits for one being written before it is turned away.
SNAPSHOT_WAIT = 30.0


class SnapshotRefused(ValueError):
    """A snapshot a peer sent does not restore; nothing was replaced."""


def checked_machine(machines: MachineFactory, open_payload: Callable[[], AbstractContextManager],
                    what: str) -> StateMachine:
    """A fresh machine restored from the payload `open_payload()` gives (call it in a worker
    thread: it reads the whole file): a snapshot that came from elsewhere is checked this way
    before it replaces anything. SnapshotRefused when it does not restore (whatever a
    malformed payload makes the machine raise, or a snapshot of another kind of machine)."""
    try:
        with open_payload() as payload:
            return machines.restored(payload)
    except Exception as exc:
        raise SnapshotRefused(f"{what} does not restore: {exc.__class__.__name__}: "
                              f"{str(exc)[:200]}") from None


async def _wait_until(done: Callable[[], bool], event: asyncio.Event, timeout: float) -> bool:
    """Wait until `done()`, looking again each time `event` is set, for at most `timeout` s.
    Returns `done()`."""
    deadline = time.monotonic() + timeout
    while not done():
        event.clear()
        left = deadline - time.monotonic()
        if left <= 0:
            return done()
        try:
            async with asyncio.timeout(left):
                await event.wait()
        except TimeoutError:
            return done()
    return True


class Snapshotter:
    def __init__(self, runtime: Runtime, store: SnapshotStore, machines: MachineFactory,
                 policy: SnapshotPolicy, latest: StoredSnapshot | None) -> None:
        self.runtime = runtime
        self.store = store
        self.machines = machines  # --state-machine
        self.policy = policy
        self.metrics = runtime.metrics
        self._busy = False
        self._idle = asyncio.Event()  # set whenever a snapshot finishes
        self._background: set[asyncio.Task] = set()
        self._log_bytes_since = 0
        self._entries_since = 0
        self.latest: StoredSnapshot | None = None
        self.bytes = 0
        # A received snapshot's file and the machine restored from it when it arrived.
        self._verified: tuple[Path, Any] | None = None
        self._sources: dict[Path, str] = {}  # received files fetched from the archive
        if latest is not None:
            self.remember(latest)

    # --- taking ----------------------------------------------------------------------------

    def counted(self, entries: tuple[Entry, ...]) -> int:
        """Count entries made durable toward the policy's thresholds; returns their bytes."""
        size = sum(len(e.data) + 24 for e in entries)
        self._entries_since += len(entries)
        self._log_bytes_since += size
        return size

    def maybe_snapshot(self, applied: int) -> None:
        """Start a snapshot in the background if the policy asks for one now."""
        if self._busy or applied <= self.runtime.core.snapshot_index:
            return
        rule = self.policy.should_snapshot(self._log_bytes_since, self._entries_since,
                                           self.bytes)
        if rule is not None:
            self._busy = True
            task = asyncio.create_task(self.take(reason=rule, claimed=True))
            self._background.add(task)  # a task nobody references may be collected mid-run
            task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self._background.discard(task)
        exc = None if task.cancelled() else task.exception()
        if exc is not None and self.runtime.fatal is not exc:
            log.error("the snapshot failed; the log keeps growing until one succeeds",
                      exc_info=exc)

    async def take(self, reason: str = "requested", *, claimed: bool = False) -> dict[str, Any]:
        """Write a snapshot of the applied state without stopping applies, then compact.
        A request that finds another snapshot being written waits for it (for at most
        SNAPSHOT_WAIT s, else RuntimeError) and then returns it, or writes a newer one
        (`claimed`: the caller already set the flag for this one)."""
        if not claimed and not await _wait_until(lambda: not self._busy, self._idle,
                                                 SNAPSHOT_WAIT):
            raise RuntimeError("a snapshot is already being written")
        self._busy = True
        runtime = self.runtime
        try:
            index = runtime.applied
            core = runtime.core
            if self.latest is not None and self.latest.meta.index == index:
                return self.document()
            meta = core.snapshot_meta(index)
            machine = runtime.machine
            # Applies go on while it is written (a frozen overlay, or a forked child).
            path = await snapshot_into_store(self.store, meta, machine)
            # Entries the archive does not have yet stay in the log (the archiver ships them).
            archiver = runtime.archiver
            retain = archiver.retain_after() if archiver is not None else None
            core.compact(index, keep_entries=0 if retain is None else max(0, index - retain))
            await asyncio.to_thread(runtime.storage.compact, index, retain)
            self.remember(StoredSnapshot(meta, machine.kind, path))
            self.metrics.snapshots_taken += 1
            log.info("snapshot at %d (%d bytes, %s)", index, self.bytes, reason)
            if archiver is not None:
                archiver.poke()
            return self.document()
        except (OSError, StorageError) as exc:
            full = disk_full(exc, runtime.data_dir)
            if full is None:
                raise
            runtime.fail(full)  # the log's next write would fail the same way: stop, exit 3
            raise full  # noqa: B904 (disk_full chained the OSError)
        finally:
            self._busy = False
            self._idle.set()

    def remember(self, stored: StoredSnapshot) -> None:
        """`stored` is now the newest snapshot file; the log counted since the last resets."""
        self.latest = stored
        self.bytes = stored.path.stat().st_size
        self._log_bytes_since = 0
        self._entries_since = 0

    def document(self) -> dict[str, Any]:
        """The answer of POST /v1/snapshot: where the newest snapshot is."""
        meta, path = self.latest.meta, self.latest.path
        return {"index": meta.index, "term": meta.term, "bytes": self.bytes,
                "location": path.resolve().as_uri()}

    # --- serving followers -----------------------------------------------------------------

    def payload(self, m: Message):
        """The file of the snapshot `m` announces, opened, or None (not the newest any more)."""
        stored = self.latest
        if stored is None or stored.meta.index != m.snapshot.meta.index:
            return None
        return self.store.open_payload(stored.path)  # verifies its checksum as it streams

    def reference(self, m: Message) -> dict[str, str] | None:
        """Where a follower can fetch the snapshot `m` announces from the archive (the headers
        of a reference), or None: stream it. Only the leader's current snapshot, once
        archived, is referenced: the follower then takes the log tail from this leader."""
        archiver = self.runtime.archiver
        if archiver is None:
            return None
        record = archiver.archived_snapshot(m.snapshot.meta.index, m.snapshot.meta.term)
        if record is None:
            return None
        return {SNAPSHOT_KEY_HEADER: record.key, SNAPSHOT_SHA_HEADER: record.sha256,
                SNAPSHOT_SIZE_HEADER: str(record.size)}

    def sent(self, peer: str, ok: bool, via: str = "leader") -> None:
        """The transport finished (or gave up) sending a snapshot to `peer`."""
        self.runtime.snapshot_reported(peer, ok)
        if ok and via == "archive":
            self.metrics.snapshot_references_sent += 1
        elif ok:
            self.metrics.snapshots_sent += 1

    # --- receiving -------------------------------------------------------------------------

    async def receive_archived(self, m: Message, key: str, sha256: str, size: int) -> None:
        """The leader says: fetch snapshot `m` from the archive at `key`. Download, verify and
        store it, then step the message. Raises ArchiveError when that cannot be done here
        (no archive configured, unreachable, corrupt): the leader then streams it."""
        archiver = self.runtime.archiver
        if archiver is None:
            raise ArchiveError("this member has no --archive configured; stream the snapshot")
        meta = m.snapshot.meta
        record = SnapshotRecord(meta.index, meta.term, key, size, sha256)
        cluster = archiver.cluster

        def fetch(path: Path) -> None:
            cluster.download_snapshot(record, path)

        try:
            stored = await asyncio.to_thread(self.store.adopt, meta, fetch)
        except (StorageError, RuntimeError) as exc:
            raise ArchiveError(f"cannot use archived snapshot {key}: {exc}") from exc

        try:  # restored into a fresh machine before anything relies on it
            machine = await asyncio.to_thread(
                checked_machine, self.machines, lambda: self.store.open_payload(stored.path),
                f"archived snapshot {key}")
        except SnapshotRefused as exc:
            stored.path.unlink(missing_ok=True)
            raise ArchiveError(str(exc)) from None
        self._verified = (stored.path, machine)
        self.latest = stored
        self.bytes = stored.path.stat().st_size
        self._sources[stored.path] = "archive"
        m.snapshot.data = stored.path
        log.info("fetched snapshot %d from %s", meta.index, cluster.location(record))
        self.runtime.deliver([m])

    async def receive_streamed(self, m: Message, chunks) -> None:
        """A leader streams us a snapshot: store it durably, then step the message."""
        meta = m.snapshot.meta
        kind = self.runtime.machine.kind
        writer = self.store.begin(meta, kind)
        try:
            async for chunk in chunks:
                await asyncio.to_thread(writer.write, chunk)
            # Restored into a fresh machine before it replaces anything: a snapshot that does
            # not restore is refused, and this member keeps running on what it had.
            machine = await asyncio.to_thread(
                checked_machine, self.machines, writer.written_payload,
                f"snapshot {meta.index} (term {meta.term})")
            path = await asyncio.to_thread(writer.commit)
        except BaseException:
            writer.abort()
            raise
        self._verified = (path, machine)
        # The store keeps one committed snapshot besides the one in progress, so this file is
        # now the newest one there (the core may still decline it if it has caught up).
        self.latest = StoredSnapshot(meta, kind, path)
        self.bytes = path.stat().st_size
        m.snapshot.data = path
        self.runtime.deliver([m])

    async def installed(self, snap: Snapshot) -> Any:
        """The machine to run from now on, holding the state of `snap` (whose file a receive
        above stored): the one restored when it arrived, or restored now."""
        path = snap.data
        if not isinstance(path, Path):
            raise StorageError("a snapshot to install arrived without its file")

        def restore() -> StateMachine:
            with self.store.open_payload(path) as payload:
                return self.machines.restored(payload)

        verified, self._verified = self._verified, None
        if verified is not None and verified[0] == path:
            machine = verified[1]  # restored when it arrived
        else:
            machine = await asyncio.to_thread(restore)
        self.remember(StoredSnapshot(snap.meta, machine.kind, path))
        source = self._sources.pop(path, "leader")
        self.metrics.snapshots_installed[source] += 1
        log.info("installed snapshot %d (from the %s)", snap.meta.index, source)
        return machine
