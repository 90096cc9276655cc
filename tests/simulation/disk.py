"""What a simulated member has made durable, shared by the simulator and the paper tests.

The log and the hard state live in `MemoryStorage`, the project's reference `LogStorage`, so
every simulated schedule also runs the storage contract the real disk log is checked against.
Beside it sits the payload of the newest snapshot, in whatever form the harness's state machine
takes. Only what a carried-out Ready wrote is here: a crash keeps exactly this.
"""

from __future__ import annotations

from typing import Any

from flotilla.node.consensus import Entry, HardState, RecoveredState, SnapshotMeta
from flotilla.node.storage import MemoryStorage


class Disk:
    def __init__(self, recovered: RecoveredState | None = None, snapshot_data: Any = None):
        self.log = MemoryStorage()
        self.snapshot_data = snapshot_data
        if recovered is not None:
            self.log.install_snapshot(recovered.snapshot)
            self.append(recovered.entries)
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
        """The entries after the snapshot."""
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

    def append(self, entries: tuple[Entry, ...] | list[Entry]) -> None:
        """An entry whose index is already stored replaces it and everything after it."""
        if entries:
            self.log.append(entries)
            self.log.sync()

    def save_hard_state(self, hs: HardState) -> None:
        self.log.save_hard_state(hs)

    def install(self, meta: SnapshotMeta, data: Any) -> None:
        """The log before the snapshot is discarded; so is a tail that does not continue it."""
        self.log.install_snapshot(meta)
        self.snapshot_data = data
