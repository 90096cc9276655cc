"""Archives written the way a leader writes them, without running a cluster: segments and
snapshots through the project's own archive client, a first configuration entry, commands
from the key-value machine's encoders. And the oracle: the node's own restore plan replayed
through the node's machine."""

from __future__ import annotations

import io
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from flotilla.node.archive import ClusterArchive, ManifestKeys, open_archive
from flotilla.node.consensus import Entry, EntryKind, Membership, SnapshotMeta
from flotilla.node.statemachine.kv import KVStateMachine
from flotilla.node.storage import PayloadReader, SnapshotStore

REGION = "us-east-1"
VOTERS = Membership(voters=frozenset({"n1", "n2", "n3"}),
                    addresses=(("n1", "http://a:1"), ("n2", "http://b:1"), ("n3", "http://c:1")))


def write_archive(url: str, cluster_id: str, commands: Sequence[bytes], *,
                  snapshot_at: Sequence[int] = (), segment_entries: int = 50,
                  term: int = 2, machine: Callable[[], Any] = KVStateMachine,
                  endpoint: str | None = None,
                  stamp: Callable[[int], int] = lambda n: 1_000 * (n + 2),
                  keys: ManifestKeys | None = None) -> list[Entry]:
    """Archive a log: a membership entry at 1, then one normal entry per command (a no-op
    after every 17th, as leader changes leave them), in segments of `segment_entries`, with a
    snapshot (as a member writes it) at each index of `snapshot_at`. Command n is stamped
    `stamp(n)` (never decreasing in n), 1 s apart by default. With `keys`, the manifest is
    signed as a member with `--archive-signing-key-file` signs it. Returns the log."""
    log = [Entry(1, 1, EntryKind.MEMBERSHIP, VOTERS.encode(), 1_000)]
    _append(log, commands, term, stamp)
    _upload(url, cluster_id, log, 0, snapshot_at, segment_entries, machine, endpoint, keys)
    return log


def extend_archive(url: str, cluster_id: str, log: list[Entry], commands: Sequence[bytes], *,
                   snapshot_at: Sequence[int] = (), segment_entries: int = 50, term: int = 2,
                   machine: Callable[[], Any] = KVStateMachine, endpoint: str | None = None,
                   stamp: Callable[[int], int] = lambda n: 1_000 * (n + 2)) -> list[Entry]:
    """Archive more of `log` (what `write_archive` archived, perhaps extended before):
    `commands` after it, in new segments, as `write_archive` does; the first is command
    number (normal entries of `log`) for `stamp`. Extends `log` and returns it."""
    archived = len(log)
    _append(log, commands, term, stamp)
    _upload(url, cluster_id, log, archived, snapshot_at, segment_entries, machine, endpoint)
    return log


def _append(log: list[Entry], commands: Sequence[bytes], term: int,
            stamp: Callable[[int], int]) -> None:
    n = sum(1 for e in log if e.kind == EntryKind.NORMAL)
    for data in commands:  # leaders' clocks: never decreasing
        log.append(Entry(len(log) + 1, term, EntryKind.NORMAL, data, stamp(n)))
        if n % 17 == 16:
            log.append(Entry(len(log) + 1, term, EntryKind.NOOP, b"", stamp(n)))
        n += 1


def _upload(url: str, cluster_id: str, log: Sequence[Entry], start: int,
            snapshot_at: Sequence[int], segment_entries: int, machine: Callable[[], Any],
            endpoint: str | None, keys: ManifestKeys | None = None) -> None:
    """Upload log[start:] in segments and a member's snapshot at each of `snapshot_at`."""
    archive = open_archive(url, endpoint=endpoint, region=endpoint and REGION)
    try:
        cluster = ClusterArchive(archive, cluster_id, keys=keys)
        for first in range(start, len(log), segment_entries):
            cluster.upload_segment(log[first:first + segment_entries])
        with tempfile.TemporaryDirectory() as tmp:
            for index in snapshot_at:
                path = member_snapshot(log, index, Path(tmp) / str(index), machine)
                entry = log[index - 1]
                cluster.upload_snapshot(path, SnapshotMeta(index, entry.term, VOTERS,
                                                           entry.ts_ms))
        cluster.publish()
    finally:
        archive.close()


def member_snapshot(log: Sequence[Entry], index: int, directory: Path,
                    machine: Callable[[], Any] = KVStateMachine) -> Path:
    sm = machine()
    for entry in log[:index]:
        if entry.kind == EntryKind.NORMAL:
            sm.apply(entry.index, entry.data)
    store = SnapshotStore(directory, fsync=False)
    entry = log[index - 1]
    return store.save(SnapshotMeta(index, entry.term, VOTERS, entry.ts_ms), sm.kind,
                      sm.write_snapshot)


def replayed_machine(url: str, cluster_id: str, index: int,
                     machine: Callable[[], Any] = KVStateMachine,
                     endpoint: str | None = None) -> Any:
    """The machine the node's restore builds at `index`: its plan, its machine."""
    archive = open_archive(url, endpoint=endpoint, region=endpoint and REGION)
    try:
        with tempfile.TemporaryDirectory() as work:
            prepared = ClusterArchive(archive, cluster_id).prepare_restore(work, index)
            sm = machine()
            if prepared.snapshot_path is not None:
                with PayloadReader(prepared.snapshot_path) as p:
                    sm.restore(p)
            for entry in prepared.entries():
                if entry.kind == EntryKind.NORMAL:
                    sm.apply(entry.index, entry.data)
            return sm
    finally:
        archive.close()


def replayed_payload(url: str, cluster_id: str, index: int,
                     machine: Callable[[], Any] = KVStateMachine,
                     endpoint: str | None = None) -> bytes:
    """What the node's restore builds at `index`: its plan, its machine, its bytes."""
    out = io.BytesIO()
    replayed_machine(url, cluster_id, index, machine, endpoint).write_snapshot(out)
    return out.getvalue()


def published_payload(url: str, cluster_id: str,
                      endpoint: str | None = None) -> tuple[SnapshotMeta, bytes]:
    """The newest snapshot of `cluster_id` in the archive: its metadata and payload."""
    archive = open_archive(url, endpoint=endpoint, region=endpoint and REGION)
    try:
        cluster = ClusterArchive(archive, cluster_id)
        manifest = cluster.manifest()
        assert manifest is not None and manifest.last_snapshot is not None
        with tempfile.TemporaryDirectory() as work:
            path = Path(work) / "s.snap"
            meta = cluster.download_snapshot(manifest.last_snapshot, path)
            with PayloadReader(path) as payload:
                return meta, payload.read()
    finally:
        archive.close()
