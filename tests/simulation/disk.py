"""What a simulated member has made durable, shared by the simulator and the paper tests.

The log and the hard state live in `MemoryStorage`, the project's reference `LogStorage`, so
every simulated schedule also runs the storage contract the real disk log is checked against.
Beside it sits the payload of the newest snapshot, in whatever form the harness's state machine
takes.

`Disk` is itself the storage the runtime's batch executor (node/executor.py) writes through,
with the durability `LogStorage` documents: appends are buffered until `sync`, the hard state
and snapshots are durable on return. A crash (`crash`) keeps exactly what was durable.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from flotilla.node.consensus import Entry, HardState, RecoveredState, SnapshotMeta
from flotilla.node.storage import MemoryStorage


class Disk:
    def __init__(self, recovered: RecoveredState | None = None, snapshot_data: Any = None):
        self.log = MemoryStorage()
        self.snapshot_data = snapshot_data
        self._unsynced: list[Entry] = []  # appended, lost by a crash before the next sync
        # Told ("persist-entries" | "persist-hard-state" | "persist-snapshot", what) as each
        # write becomes durable.
        self.observer: Callable[[str, Any], None] = lambda event, what: None
        if recovered is not None:
            self.log.install_snapshot(recovered.snapshot)
            if recovered.entries:
                self.log.append(recovered.entries)
                self.log.sync()
            self.log.note_commit(recovered.commit)
            self.log.save_hard_state(recovered.hard_state)

    def recovered(self) -> RecoveredState:
        return self.log.recover()

    @property
    def hard_state(self) -> HardState:
        return self.log.recover().hard_state

    @property
    def snapshot(self) -> SnapshotMeta:
        return self.log.recover().snapshot

    @property
    def entries(self) -> list[Entry]:
        """The durable entries after the snapshot."""
        return self.log.recover().entries

    def terms(self) -> list[int]:
        return [e.term for e in self.entries]

    def holds(self, index: int, term: int) -> bool:
        """Whether (index, term) is durable here; an index a snapshot covers counts (snapshots
        are taken of committed state)."""
        if index < self.log.first_index():
            return True
        try:
            return self.log.term(index) == term
        except LookupError:
            return False

    def crash(self) -> None:
        """Lose what was appended and not synced."""
        self._unsynced = []

    def install(self, meta: SnapshotMeta, data: Any) -> None:
        """A snapshot of the harness's machine, taken by the member itself, made durable with
        its payload; the log before it is discarded (so is a tail that does not continue it)."""
        self.snapshot_data = data
        self.install_snapshot(meta)

    # --- LogStorage, as the batch executor writes through it -------------------------------

    def append(self, entries: Sequence[Entry]) -> None:
        if entries:
            first = entries[0].index
            self._unsynced = [e for e in self._unsynced if e.index < first] + list(entries)

    def sync(self) -> None:
        entries, self._unsynced = self._unsynced, []
        if entries:
            self.log.append(entries)  # an entry already stored replaces it and what follows
            self.log.sync()
            self.observer("persist-entries", tuple(entries))

    def save_hard_state(self, hs: HardState) -> None:
        self.log.save_hard_state(hs)
        self.observer("persist-hard-state", hs)

    def install_snapshot(self, meta: SnapshotMeta) -> None:
        self.sync()
        self.log.install_snapshot(meta)
        self.observer("persist-snapshot", meta)

    def note_commit(self, index: int) -> None:
        """Recorded at once, as far as the log is durable: the real log records it lazily (with
        a hard state, about once a second, at close), so a restarted member here finds the
        most it ever could, and applies all of it before hearing from a leader."""
        self.log.note_commit(index)
        self.log.save_commit()

    def save_commit(self) -> bool:
        return self.log.save_commit()
