"""`MemoryStorage`: the reference `LogStorage`, where "durable" means "in the object".

It exists for the deterministic simulator and as the yardstick `DiskStorage` is checked
against. So that a simulated crash loses everything a real one may lose (the worst case), it
tracks what has been synced and `crash_copy()` returns only that.
"""

from __future__ import annotations

from collections.abc import Sequence

from flotilla.node.consensus.types import (
    EMPTY_MEMBERSHIP,
    Entry,
    HardState,
    RecoveredState,
    SnapshotMeta,
)

from .entrylog import EntryLog, EntryLogReads


class MemoryStorage(EntryLogReads):
    """A `LogStorage` in memory, with a crash model.

    Invariant: the durable log is always a prefix of the current one, `_log.entries` up to
    `_durable_last`. That holds because the only way the current log stops extending the
    durable one is a truncation, and a truncation is durable at once (as on disk).
    """

    def __init__(self, *, keep_trailing_entries: int = 0) -> None:
        if keep_trailing_entries < 0:
            raise ValueError("keep_trailing_entries must be >= 0")
        self.keep_trailing_entries = keep_trailing_entries
        self._log = EntryLog()
        self._snapshot = SnapshotMeta(index=0, term=0, membership=EMPTY_MEMBERSHIP)
        self._hard_state = HardState()
        self._durable_last = 0
        self._commit_noted = 0  # what `note_commit` was told
        self._commit = 0  # the commit index recorded (never beyond `_durable_last`)
        self._closed = False

    # --- the crash model -------------------------------------------------------------------

    def crash_copy(self) -> MemoryStorage:
        """A new storage holding only what a crash right now would leave: every synced entry,
        the hard state and the snapshot point; no appended-but-unsynced entries."""
        copy = MemoryStorage(keep_trailing_entries=self.keep_trailing_entries)
        durable = self._log.entries(self._log.first_index(), self._durable_last + 1)
        copy._log = EntryLog(self._log.base_index, self._log.base_term, durable)
        copy._snapshot = self._snapshot
        copy._hard_state = self._hard_state
        copy._durable_last = copy._log.last_index()
        copy._commit = copy._commit_noted = self._commit
        return copy

    # --- LogStorage ------------------------------------------------------------------------

    def recover(self) -> RecoveredState:
        return RecoveredState(
            hard_state=self._hard_state,
            snapshot=self._snapshot,
            entries=self._log.after(self._snapshot.index),
            commit=self._commit,
        )

    def append(self, entries: Sequence[Entry]) -> None:
        self._check_open()
        if not entries:
            return
        self._log.check_append(entries, self._snapshot.index)
        first = entries[0].index
        if first <= self._log.last_index():
            self._log.truncate_from(first)
            self._durable_last = min(self._durable_last, first - 1)
        self._log.extend(entries)

    def sync(self) -> None:
        self._check_open()
        self._durable_last = self._log.last_index()

    def save_hard_state(self, hs: HardState) -> None:
        self._check_open()
        self._hard_state = hs
        self.save_commit()  # as on disk: the commit index rides with the hard state

    def note_commit(self, index: int) -> None:
        """Entries up to `index` are committed: remembered, and recorded by `save_commit`, the
        next hard state or `close`, never beyond what is durable."""
        self._commit_noted = max(self._commit_noted, index)

    def save_commit(self) -> bool:
        """Record the noted commit index, as far as the log is durable; whether it moved."""
        self._check_open()
        commit = max(self._commit, min(self._commit_noted, self._durable_last))
        moved, self._commit = commit > self._commit, commit
        return moved

    def install_snapshot(self, meta: SnapshotMeta) -> None:
        self._check_open()
        if meta.index < self._snapshot.index:
            raise ValueError(
                f"snapshot at index {meta.index} is older than the current one at "
                f"{self._snapshot.index}"
            )
        self.sync()
        if self._holds(meta.index, meta.term):
            self._log.drop_through(meta.index)
        else:
            self._log.reset(meta.index, meta.term)
        self._snapshot = meta
        self._durable_last = self._log.last_index()

    def compact(self, index: int, retain_after: int | None = None) -> None:
        self._check_open()
        if index > self._log.last_index():
            raise ValueError(
                f"cannot compact to {index}: the last index is {self._log.last_index()}"
            )
        self.sync()
        if index > self._snapshot.index:
            self._snapshot = self._log.snapshot_at(index, self._snapshot)
        limit = min(index - self.keep_trailing_entries, self._snapshot.index)
        if retain_after is not None:
            limit = min(limit, retain_after)
        self._log.drop_through(limit)

    def close(self) -> None:
        if not self._closed:
            self.save_commit()
        self._closed = True

    # --- helpers ---------------------------------------------------------------------------

    def _holds(self, index: int, term: int) -> bool:
        return (
            self._log.base_index <= index <= self._log.last_index()
            and self._log.term(index) == term
        )

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("storage is closed")
