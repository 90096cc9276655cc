"""`LogStorage`: the one interface the runtime uses for a member's log and hard state.

Two implementations pass the same conformance suite (tests/storage/test_conformance.py):
`MemoryStorage`, the reference whose "durable" means "in the object", and `DiskStorage`, the
segmented write-ahead log. The consensus core never sees either: the runtime reads
`recover()` once, then carries out each `Ready` batch with `append`, `sync`,
`save_hard_state` and `install_snapshot`.

The log's shape, in the words every method below relies on:

    ... [first_index ............ snapshot.index ............ last_index]
        trailing entries, kept    | entries after the snapshot: what
        for slow followers        | `recover()` hands the core

- `snapshot` (a `SnapshotMeta`) is the point the log is covered to by a state-machine snapshot
  the runtime keeps elsewhere (`SnapshotStore`). It moves forward through `install_snapshot`
  and `compact`, and is what `recover()` returns.
- Invariant: `first_index() - 1 <= snapshot.index <= last_index()`. `term(i)` answers for
  every `i` in `[first_index() - 1, last_index()]` (the entry before the first one is kept as
  an (index, term) pair so a leader can still send its successor).
- Durability: `append` is buffered and becomes durable with the next `sync()`; but a
  truncation (an append that replaces a suffix) is durable when `append` returns, because
  interleaving the new records with the not-yet-truncated old ones after a crash would
  produce a log that never existed. `save_hard_state`, `install_snapshot` and `compact` are
  durable on return, and the last two `sync()` first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from flotilla.node.consensus.types import Entry, HardState, RecoveredState, SnapshotMeta


@runtime_checkable
class LogStorage(Protocol):
    """A member's durable log and hard state. Used by one owner; `sync()` may run in a worker
    thread while the owner appends, which is how group commit overlaps disk and CPU."""

    def recover(self) -> RecoveredState:
        """The durable state after opening: hard state, the snapshot the log is covered to, and
        the entries after it (contiguous). Called once after opening."""
        ...

    def append(self, entries: Sequence[Entry]) -> None:
        """Add contiguous entries, replacing the stored suffix from `entries[0].index` on.

        Raises ValueError for a gap (`entries[0].index > last_index() + 1`), for entries that
        are not contiguous, and for an attempt to replace entries the snapshot covers.
        Buffered: durable only after the next `sync()` (a truncation is durable at once).
        """
        ...

    def sync(self) -> None:
        """Group commit: make everything appended before this call durable, with one fsync."""
        ...

    def save_hard_state(self, hs: HardState) -> None:
        """Replace the hard state (term and vote) atomically; durable on return."""
        ...

    def note_commit(self, index: int) -> None:
        """Entries up to `index` are committed. Only remembered: recorded by `save_commit`,
        the next `save_hard_state` or `close`, and never beyond what is durable, so that
        `recover()` can hand it back (`RecoveredState.commit`)."""
        ...

    def save_commit(self) -> bool:
        """Record the noted commit index (as far as the log is durable) if it moved since it
        was last recorded; returns whether it did. Durable on return."""
        ...

    def install_snapshot(self, meta: SnapshotMeta) -> None:
        """The log now starts right after `meta.index`.

        If the log holds (meta.index, meta.term) the entries after it are kept (Log Matching:
        they agree with the leader's log up to there); otherwise the whole log is discarded.
        Raises ValueError for a snapshot older than the current one. Durable on return.
        """
        ...

    def compact(self, index: int, retain_after: int | None = None) -> None:
        """Entries up to `index` are covered by a snapshot the runtime has made durable.

        Moves `snapshot` to `index` (its term and the configuration in force there are read
        from the log) and frees storage at or below `index - keep_trailing_entries`, so slow
        followers can still be sent entries instead of a snapshot. How much is freed is up to
        the implementation (a disk log frees whole segments); `first_index()` tells. Raises
        ValueError if `index > last_index()`. Durable on return. Entries after `retain_after`
        (when given) are kept whatever the snapshot covers: the archiver has not shipped them.
        """
        ...

    def first_index(self) -> int:
        """The lowest index `entries()` can return."""
        ...

    def last_index(self) -> int:
        """The highest index appended (or the snapshot index when the log after it is empty)."""
        ...

    def term(self, index: int) -> int:
        """The term of entry `index`, for `first_index() - 1 <= index <= last_index()`.

        Raises CompactedError below that range and UnavailableError above it.
        """
        ...

    def entries(self, lo: int, hi: int) -> list[Entry]:
        """Entries `lo` to `hi - 1`. Raises CompactedError if `lo < first_index()` and
        UnavailableError if `hi > last_index() + 1`."""
        ...

    def close(self) -> None:
        """Record the commit index (`save_commit`) and release files. Does not sync: unsynced
        appends are as safe as after a crash."""
        ...
