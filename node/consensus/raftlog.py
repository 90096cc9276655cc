"""The core's view of its log: entries since the last compaction, and where each one stands.

Invariants (checked by `check_invariants`, which the simulator calls after every step):
    offset <= snapshot.index <= applied <= committed <= last_index
    stable <= last_index            (entries up to `stable` are known to be durable)
    entries[i].index == offset + 1 + i
    offset_ts <= entries[0].ts_ms <= entries[1].ts_ms <= ...   (times never decrease)
A leader's own acknowledgement counts only up to `stable`, so nothing is committed on the
strength of a write that has not reached the leader's disk.

The membership history lists every membership entry still in the log, plus one base entry at
or below `offset`: a member always acts on the newest membership in its log, committed or not
(Raft dissertation, section 4.1), and goes back to the previous one when that entry is
truncated away.
"""

from __future__ import annotations

from .types import Entry, EntryKind, Membership, Snapshot, SnapshotMeta


class LogError(AssertionError):
    """A caller broke the core's contract (never caused by a peer's message)."""


class RaftLog:
    __slots__ = (
        "applied",
        "committed",
        "entries",
        "handed",
        "membership_history",
        "offset",
        "offset_term",
        "offset_ts",
        "pending_snapshot",
        "snapshot",
        "stable",
        "unsent",
    )

    def __init__(self, snapshot: SnapshotMeta, entries: list[Entry]) -> None:
        self.snapshot = snapshot
        self.offset = snapshot.index
        self.offset_term = snapshot.term
        self.offset_ts = snapshot.ts_ms
        self.entries: list[Entry] = []
        self.committed = snapshot.index
        self.applied = snapshot.index  # acknowledged applied (advance)
        self.handed = snapshot.index  # handed out for applying in a Ready
        self.pending_snapshot: Snapshot | None = None
        self.membership_history: list[tuple[int, Membership]] = [
            (snapshot.index, snapshot.membership)
        ]
        if entries:
            if entries[0].index != self.offset + 1:
                raise LogError(
                    f"recovered entries start at {entries[0].index}, expected {self.offset + 1}"
                )
            self._extend(entries)
        self.stable = self.last_index()
        self.unsent = self.last_index() + 1

    # --- reading -------------------------------------------------------------------------

    def last_index(self) -> int:
        return self.offset + len(self.entries)

    def first_index(self) -> int:
        return self.offset + 1

    def last_term(self) -> int:
        return self.entries[-1].term if self.entries else self.offset_term

    def last_ts(self) -> int:
        """The time of the last entry (what the next one is stamped no earlier than)."""
        return self.entries[-1].ts_ms if self.entries else self.offset_ts

    def ts(self, index: int) -> int | None:
        """The time of the entry at `index`, or None if it is compacted away or not there."""
        if index == self.offset:
            return self.offset_ts
        pos = index - self.offset - 1
        if pos < 0 or pos >= len(self.entries):
            return None
        return self.entries[pos].ts_ms

    def term(self, index: int) -> int | None:
        """The term of the entry at `index`, or None if it is compacted away or not there."""
        if index == self.offset:
            return self.offset_term
        pos = index - self.offset - 1
        if pos < 0 or pos >= len(self.entries):
            return None
        return self.entries[pos].term

    def match_term(self, index: int, term: int) -> bool:
        return self.term(index) == term

    def slice(self, lo: int, max_count: int, max_bytes: int) -> list[Entry]:
        """Entries from `lo` on: at most `max_count`, and at most `max_bytes` of data unless
        a single entry is larger."""
        start = lo - self.offset - 1
        if start < 0:
            raise LogError(f"entry {lo} is compacted (log starts at {self.offset + 1})")
        chunk = self.entries[start : start + max_count]
        size = 0
        for n, entry in enumerate(chunk):
            size += len(entry.data)
            if size > max_bytes and n > 0:
                return chunk[:n]
        return chunk

    def is_up_to_date(self, index: int, term: int) -> bool:
        """Whether a log ending at (index, term) is at least as up to date as this one (5.4.1)."""
        last_term = self.last_term()
        return term > last_term or (term == last_term and index >= self.last_index())

    def membership(self) -> Membership:
        return self.membership_history[-1][1]

    def membership_index(self) -> int:
        return self.membership_history[-1][0]

    def membership_at(self, index: int) -> Membership:
        found = self.membership_history[0][1]
        for at, membership in self.membership_history:
            if at > index:
                break
            found = membership
        return found

    def conflict_hint(self, index: int, term: int) -> tuple[int, int]:
        """For a rejected append at (index, term): the last index at or below `index` whose term
        is <= `term`, and its term. The leader can then skip every entry of a conflicting term
        in one round trip instead of one per entry."""
        index = min(index, self.last_index())
        while index > self.offset:
            t = self.term(index)
            if t is not None and t <= term:
                return index, t
            index -= 1
        return self.offset, self.offset_term

    # --- writing -------------------------------------------------------------------------

    def append(self, entries: list[Entry] | tuple[Entry, ...]) -> None:
        """Append entries; an entry at an index already present replaces it and what follows."""
        if not entries:
            return
        first = entries[0].index
        if first <= self.committed:
            raise LogError(f"entry {first} would overwrite committed entry {self.committed}")
        if first > self.last_index() + 1:
            raise LogError(f"gap: appending {first} after {self.last_index()}")
        if first <= self.last_index():
            self._truncate_from(first)
        self._extend(entries)

    def maybe_append(
        self, prev_index: int, prev_term: int, commit: int, entries: tuple[Entry, ...] | list[Entry]
    ) -> int | None:
        """A follower's handling of an append (Figure 2, AppendEntries receiver rules 2-5).

        Returns the index of the last entry the message covers, or None if the log does not
        contain an entry at `prev_index` with `prev_term`.
        """
        if not self.match_term(prev_index, prev_term):
            return None
        last_new = prev_index + len(entries)
        last = self.last_index()
        for pos, entry in enumerate(entries):
            if entry.index > last or self.term(entry.index) != entry.term:
                self.append(entries[pos:])
                break
        if commit > self.committed:
            self.commit_to(min(commit, last_new))
        return last_new

    def commit_to(self, index: int) -> None:
        if index > self.committed:
            if index > self.last_index():
                raise LogError(f"commit {index} is beyond the last index {self.last_index()}")
            self.committed = index

    def stable_to(self, index: int, term: int) -> None:
        """The caller made the log durable up to (index, term)."""
        if index > self.stable and self.term(index) == term:
            self.stable = index

    def restore(self, snapshot: Snapshot) -> None:
        """Replace the whole log with `snapshot` (the follower is too far behind to catch up)."""
        meta = snapshot.meta
        self.entries = []
        self.offset = meta.index
        self.offset_term = meta.term
        self.offset_ts = meta.ts_ms
        self.snapshot = meta
        self.committed = meta.index
        self.applied = meta.index  # the caller installs the snapshot before applying anything
        self.handed = meta.index
        self.stable = meta.index
        self.unsent = meta.index + 1
        self.pending_snapshot = snapshot
        self.membership_history = [(meta.index, meta.membership)]

    def compact(self, snapshot: SnapshotMeta, keep_from: int) -> None:
        """Record `snapshot` and forget entries before `keep_from` (a trailing window kept for
        slow followers). Nothing at or after `keep_from` is dropped."""
        if snapshot.index > self.applied:
            raise LogError(f"snapshot {snapshot.index} is ahead of applied {self.applied}")
        if snapshot.index > self.snapshot.index:
            self.snapshot = snapshot
        new_offset = min(keep_from - 1, snapshot.index)
        if new_offset <= self.offset:
            return
        base = self.entries[new_offset - self.offset - 1]
        del self.entries[: new_offset - self.offset]
        self.offset = new_offset
        self.offset_term = base.term
        self.offset_ts = base.ts_ms
        history = self.membership_history
        while len(history) > 1 and history[1][0] <= new_offset:
            history.pop(0)

    def unsent_entries(self) -> tuple[Entry, ...]:
        if self.unsent > self.last_index():
            return ()
        out = tuple(self.entries[self.unsent - self.offset - 1 :])
        self.unsent = self.last_index() + 1
        return out

    def committed_to_hand(self, max_count: int) -> tuple[Entry, ...]:
        if self.handed >= self.committed:
            return ()
        start = self.handed - self.offset
        stop = min(self.committed - self.offset, start + max_count)
        out = tuple(self.entries[start:stop])
        self.handed = out[-1].index
        return out

    def check_invariants(self) -> None:
        if not (self.offset <= self.snapshot.index <= self.applied <= self.committed):
            raise LogError(
                f"offset {self.offset} <= snapshot {self.snapshot.index} <= applied "
                f"{self.applied} <= committed {self.committed} violated"
            )
        if self.committed > self.last_index():
            raise LogError(f"committed {self.committed} > last index {self.last_index()}")
        if self.stable > self.last_index():
            raise LogError(f"stable {self.stable} > last index {self.last_index()}")
        ts = self.offset_ts
        for pos, entry in enumerate(self.entries):
            if entry.index != self.offset + 1 + pos:
                raise LogError(f"entry at position {pos} has index {entry.index}")
            if entry.ts_ms < ts:
                raise LogError(f"entry {entry.index} is stamped {entry.ts_ms} ms, before the "
                               f"entry ahead of it ({ts} ms)")
            ts = entry.ts_ms

    # --- internals -----------------------------------------------------------------------

    def _truncate_from(self, index: int) -> None:
        del self.entries[index - self.offset - 1 :]
        if self.stable >= index:
            self.stable = index - 1
        if self.unsent > index:
            self.unsent = index
        history = self.membership_history
        while len(history) > 1 and history[-1][0] >= index:
            history.pop()

    def _extend(self, entries: list[Entry] | tuple[Entry, ...]) -> None:
        self.entries.extend(entries)
        for entry in entries:
            if entry.kind == EntryKind.MEMBERSHIP:
                self.membership_history.append((entry.index, Membership.decode(entry.data)))
