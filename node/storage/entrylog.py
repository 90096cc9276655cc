"""`EntryLog`: the log's entries held in memory, shared by both `LogStorage` implementations.

`MemoryStorage` is nothing but this plus a durability model; `DiskStorage` keeps the same
window in memory in front of its segment files (see wal.py for why). Sharing it means the
append rules (no gaps, no rewriting what a snapshot covers) are written once.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from flotilla.node.consensus.types import Entry, EntryKind, Membership, SnapshotMeta

from .errors import CompactedError, UnavailableError


class EntryLog:
    """Entries `base_index + 1 ..= last_index()` and the term of entry `base_index`.

    Invariant: `self._entries[k].index == self.base_index + 1 + k` for every k.
    """

    __slots__ = ("_entries", "base_index", "base_term")

    def __init__(self, base_index: int = 0, base_term: int = 0, entries: Iterable[Entry] = ()):
        self.base_index = base_index
        self.base_term = base_term
        self._entries: list[Entry] = list(entries)

    def first_index(self) -> int:
        return self.base_index + 1

    def last_index(self) -> int:
        return self.base_index + len(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def term(self, index: int) -> int:
        offset = index - self.base_index
        if offset > 0:
            if offset > len(self._entries):
                raise UnavailableError(
                    f"index {index} is beyond the last index {self.last_index()}"
                )
            return self._entries[offset - 1].term
        if offset == 0:
            return self.base_term
        raise CompactedError(f"index {index} is compacted (the log starts after {self.base_index})")

    def entries(self, lo: int, hi: int) -> list[Entry]:
        if lo > hi:
            raise ValueError(f"entries({lo}, {hi}): lo must not exceed hi")
        if lo <= self.base_index:
            raise CompactedError(
                f"index {lo} is compacted (the first index is {self.first_index()})"
            )
        if hi > self.last_index() + 1:
            raise UnavailableError(f"index {hi - 1} is beyond the last index {self.last_index()}")
        return self._entries[lo - self.base_index - 1 : hi - self.base_index - 1]

    def after(self, index: int) -> list[Entry]:
        """The entries after `index` (which must be at or above `base_index`)."""
        return self._entries[max(0, index - self.base_index) :]

    def check_append(self, entries: Sequence[Entry], snapshot_index: int) -> None:
        """Raise ValueError unless `entries` may be appended (they must be non-empty)."""
        first = entries[0].index
        if first > self.last_index() + 1:
            raise ValueError(
                f"cannot append index {first}: the last index is {self.last_index()} "
                "(a gap in the log is a caller bug)"
            )
        if first <= snapshot_index:
            raise ValueError(
                f"cannot replace index {first}: entries up to {snapshot_index} are covered by a "
                "snapshot and therefore committed"
            )
        for offset, entry in enumerate(entries):
            if entry.index != first + offset:
                raise ValueError(
                    f"entries to append are not contiguous: index {entry.index} at position "
                    f"{offset} of a batch starting at {first}"
                )

    def truncate_from(self, index: int) -> None:
        """Drop entries `index ..= last_index()`."""
        del self._entries[max(0, index - self.base_index - 1) :]

    def extend(self, entries: Sequence[Entry]) -> None:
        self._entries.extend(entries)

    def drop_through(self, index: int) -> None:
        """Forget entries up to `index` (at most `last_index()`), remembering its term."""
        if index <= self.base_index:
            return
        self.base_term = self.term(index)
        del self._entries[: index - self.base_index]
        self.base_index = index

    def reset(self, base_index: int, base_term: int) -> None:
        """Discard every entry: the log is empty after (base_index, base_term)."""
        self._entries.clear()
        self.base_index = base_index
        self.base_term = base_term

    def snapshot_at(self, index: int, current: SnapshotMeta) -> SnapshotMeta:
        """The `SnapshotMeta` of a snapshot covering the log up to `index >= current.index`.

        Its time is that of the entry at `index`. The configuration in force at `index` is the
        newest MEMBERSHIP entry at or below it (a configuration takes effect as soon as it is in
        a log), else the current snapshot's.
        """
        if index == current.index:
            return current
        membership = current.membership
        lowest = max(current.index - self.base_index, 0)  # position of current.index + 1
        for position in range(index - self.base_index - 1, lowest - 1, -1):
            entry = self._entries[position]
            if entry.kind == EntryKind.MEMBERSHIP:
                membership = Membership.decode(entry.data)
                break
        term = self.term(index)  # raises for an index outside the log
        return SnapshotMeta(index=index, term=term, membership=membership,
                            ts_ms=self._entries[index - self.base_index - 1].ts_ms)


class EntryLogReads:
    """The read side of `LogStorage`, the same for every backend that keeps its entries in an
    `EntryLog` named `_log` (both do: see wal.py for why the disk log does too)."""

    _log: EntryLog

    def first_index(self) -> int:
        return self._log.first_index()

    def last_index(self) -> int:
        return self._log.last_index()

    def term(self, index: int) -> int:
        return self._log.term(index)

    def entries(self, lo: int, hi: int) -> list[Entry]:
        return self._log.entries(lo, hi)
