"""The log-start file: where the write-ahead log begins, and which segments belong to it.

Segments alone cannot say where the log starts: a snapshot install can leave the start in the
middle of a segment, and compaction deletes segment files one by one. So the start is recorded
here, atomically, and this file is the commit point of every operation that moves it: it is
written first and segments are deleted after, so a crash in between leaves files recovery
simply deletes again.

`generation` is what makes discarding the whole log atomic. A snapshot install that does not
match the log bumps it; every segment records the generation it was written in, and recovery
deletes segments of older generations. Without it, a crash after this file was rewritten but
before the old segments were unlinked would resurrect the discarded entries that follow the
snapshot index.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import msgpack
from flotilla.node.consensus.types import EMPTY_MEMBERSHIP, Membership, SnapshotMeta

from .checkedfile import read_checked, write_checked
from .errors import CorruptDataError

MAGIC = b"FLOTLST\x00"
# Version 2 adds the snapshot's time (`SnapshotMeta.ts_ms`) to the payload; version 1 files,
# written by the first release, are read with time 0 (unknown).
VERSION = 2
READS = (1, 2)


NO_SNAPSHOT = SnapshotMeta(index=0, term=0, membership=EMPTY_MEMBERSHIP)


@dataclass(frozen=True, slots=True)
class LogStart:
    """Invariant: `base_index <= snapshot.index`. The log holds entries after `base_index`
    (whose term is `base_term`); those up to `snapshot.index` are kept only for followers."""

    generation: int = 0
    snapshot: SnapshotMeta = NO_SNAPSHOT
    base_index: int = 0
    base_term: int = 0


class LogStartFile:
    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = True) -> None:
        self.path = Path(path)
        self._fsync = fsync

    def exists(self) -> bool:
        return self.path.exists()

    def load(self) -> LogStart:
        payload = read_checked(self.path, MAGIC, READS)
        if payload is None:
            return LogStart()
        try:
            fields = msgpack.unpackb(payload)
            if len(fields) == 6:
                fields.append(0)
            generation, index, term, membership, base_index, base_term, ts_ms = fields
            membership = Membership.decode(membership)
            if not isinstance(ts_ms, int):
                raise TypeError(f"snapshot time {ts_ms!r} is not an integer")
            snapshot = SnapshotMeta(index=index, term=term, membership=membership, ts_ms=ts_ms)
        except (ValueError, TypeError, KeyError, AttributeError, msgpack.UnpackException) as exc:
            raise CorruptDataError(self.path, 0, f"payload does not decode: {exc}") from exc
        return LogStart(generation, snapshot, base_index, base_term)

    def save(self, start: LogStart) -> None:
        snapshot = start.snapshot
        payload = msgpack.packb(
            [
                start.generation,
                snapshot.index,
                snapshot.term,
                snapshot.membership.encode(),
                start.base_index,
                start.base_term,
                snapshot.ts_ms,
            ]
        )
        write_checked(self.path, MAGIC, VERSION, payload, fsync=self._fsync)
