"""`DiskStorage`: the member's log as a segmented write-ahead log, plus its hard-state file.

Layout under the data dir:

    hardstate                    term, vote and commit index (hardstate.py)
    wal/start                    where the log starts, and its generation (logstart.py)
    wal/0000000000000001.seg     segments, named by their first index (segment.py)
    wal/0000000000004711.seg     ... the newest one is the only one written to

Write path. `append` encodes every entry of the call into one buffer and hands it to one
`os.write` on the newest segment; `sync` is one fdatasync of that file (plus the directory when
a segment was created or removed since the last sync). Those are the only syscalls on the hot
path, so a batch of entries costs one write and one fsync however many entries it holds.

Why entries are also kept in memory (rather than an index of file offsets): reads are on the
hot path too (a leader sends every entry to every follower right after appending it, and the
core asks `term()` on every append it receives), and serving them from a list costs no syscall,
no decoding and no open file handle per sealed segment. The price is memory for the entries
since the last compaction (plus `keep_trailing_entries`), which the snapshot policy bounds
since every snapshot is followed by `compact()`; and the core holds the same entries anyway
after `recover()`. Per segment we keep only an array of record offsets (8 bytes per entry),
which truncation needs.

Crash safety rests on three rules, each cheap because it is off the hot path:
- A segment is sealed by fsyncing it (and making the file read-only) before its successor is
  created, and a segment is created complete (header written to a temporary name, fsynced,
  renamed). So every segment but the newest is whole and durable, and any damage in one is
  corruption, never a torn write. (This costs two fsyncs per rotation inside `append`, once
  per `segment_bytes`; deferring them to `sync()` would let a crash leave a short sealed
  segment followed by a newer one, which recovery could not tell from real damage.)
- A truncation (an append that replaces a suffix: only after a leader change) is made durable
  before the new records are written, so a crash cannot mix new records with the old ones.
- wal/start is written before segments are deleted (see logstart.py).
Recovery therefore cuts back a torn tail of the newest segment and refuses everything else,
including a log that ends before the commit index the hard state recorded (committed entries
were lost: a segment deleted, a volume restored from an old copy) and a log without a hard state
(its votes were lost). Nothing is changed on disk before those checks pass.

The commit index is recorded cheaply (see hardstate.py): `note_commit` only remembers it, and
it is written with the next hard-state change, by `save_commit` (the runtime calls it about once
a second, off the write path) and at `close`. What is recorded never exceeds what a completed
fsync covers, so a crash can never leave the log shorter than the recorded commit.

Threading: one owner calls everything; `sync()` may run in a worker thread meanwhile (an
asyncio runtime runs it in an executor and keeps appending), so it only takes the lock to grab
a duplicate of the active file descriptor and fsyncs outside it.
"""

from __future__ import annotations

import logging
import os
import threading
from array import array
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from flotilla.node.consensus.types import Entry, HardState, RecoveredState, SnapshotMeta

from .entrylog import EntryLog, EntryLogReads
from .errors import CorruptDataError, StorageError, StorageFailedError
from .fsutil import (
    FILE_MODE,
    TEMP_SUFFIX,
    datasync,
    ensure_dir,
    fsync_dir,
    remove_temp_files,
    write_all,
)
from .hardstate import NAME as HARD_STATE_NAME
from .hardstate import HardStateFile, SavedHardState
from .logstart import LogStart, LogStartFile
from .segment import (
    SUFFIX,
    ScanResult,
    SegmentHeader,
    decode_header,
    encode_header,
    parse_segment_name,
    record_encoder,
    scan_records,
    segment_name,
    valid_record_after,
)
from .space import disk_full

log = logging.getLogger(__name__)

MiB = 1 << 20
DEFAULT_SEGMENT_BYTES = 64 * MiB
_HEADER_READ = 1 << 17  # more than any segment header (cluster ids are at most 64 KiB)
_START_NAME = "start"
READ_ONLY = 0o400  # the mode of sealed segments: only the newest one is ever written
WRITABLE = FILE_MODE


@dataclass(eq=False, slots=True)
class Segment:
    """One segment file. Invariant: record k (at byte `offsets[k]`) holds `first_index + k`,
    and `size` is the end of the last whole record. Only the newest one has an open `fd`."""

    path: Path
    first_index: int
    offsets: array = field(default_factory=lambda: array("Q"))
    size: int = 0
    fd: int | None = None

    @property
    def last_index(self) -> int:
        return self.first_index + len(self.offsets) - 1


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """A sealed segment as the archiver sees it (see `DiskStorage.sealed_segments`)."""

    path: Path
    first_index: int
    last_index: int


class DiskStorage(EntryLogReads):
    """A `LogStorage` on disk. Opening it recovers: see the module docstring.

    Raises CorruptDataError when opening a log it will not repair (anything but a torn tail of
    the newest segment, or segments of another cluster).
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        cluster_id: str,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        keep_trailing_entries: int = 0,
        fsync: bool = True,
    ) -> None:
        if segment_bytes <= 0:
            raise ValueError("segment_bytes must be positive")
        if keep_trailing_entries < 0:
            raise ValueError("keep_trailing_entries must be >= 0")
        self.data_dir = Path(data_dir)
        self.wal_dir = self.data_dir / "wal"
        self.cluster_id = cluster_id
        self.segment_bytes = segment_bytes
        self.keep_trailing_entries = keep_trailing_entries
        self._fsync = fsync
        self._lock = threading.Lock()
        self._encode = record_encoder()
        self._hard_state_file = HardStateFile(self.data_dir / HARD_STATE_NAME, fsync=fsync)
        self._start_file = LogStartFile(self.wal_dir / _START_NAME, fsync=fsync)
        self._segments: list[Segment] = []
        self._log = EntryLog()
        self._start = LogStart()
        self._saved = SavedHardState()  # what the hard-state file holds
        self._hard_state_lock = threading.Lock()  # one writer of that file at a time
        self._commit_noted = 0  # the highest commit index `note_commit` was told
        self._durable_index = 0  # the last index a completed fsync covers
        self._truncations = 0  # so that a sync does not vouch for entries truncated meanwhile
        # Counters, so that a sync() returns early only when a *completed* fsync covers
        # everything: with sync() in a worker thread, another may be in flight.
        self._appends = 0  # append calls so far
        self._dir_changes = 0  # segment files created without a directory fsync since
        self._synced_appends = 0  # the value of `_appends` a completed sync covers
        self._synced_dir_changes = 0
        self._failed: BaseException | None = None
        self._closed = False
        self._recover()

    # --- LogStorage: write side -------------------------------------------------------------

    def recover(self) -> RecoveredState:
        return RecoveredState(
            hard_state=self._saved.hard_state,
            snapshot=self._start.snapshot,
            entries=self._log.after(self._start.snapshot.index),
            commit=self._saved.commit,
        )

    def append(self, entries: Sequence[Entry]) -> None:
        if not entries:
            return
        with self._lock:
            self._check_usable()
            self._log.check_append(entries, self._start.snapshot.index)
            with self._failing_for_good(self._active.path):
                if entries[0].index <= self._log.last_index():
                    self._truncate_from(entries[0].index)
                self._write(entries)
            self._log.extend(entries)
            self._appends += 1

    def sync(self) -> None:
        with self._lock:
            self._check_usable()
            appends, dir_changes = self._appends, self._dir_changes
            if appends == self._synced_appends and dir_changes == self._synced_dir_changes:
                return
            last, truncations = self._log.last_index(), self._truncations
            path = self._active.path
            fd = os.dup(self._active.fd)  # stays valid even if the owner rotates meanwhile
        try:
            with self._failing_for_good(path):
                if self._fsync:
                    datasync(fd)
                    if dir_changes != self._synced_dir_changes:
                        fsync_dir(self.wal_dir)
        finally:
            os.close(fd)
        with self._lock:
            self._synced_appends = max(self._synced_appends, appends)
            self._synced_dir_changes = max(self._synced_dir_changes, dir_changes)
            if truncations == self._truncations:
                self._durable_index = max(self._durable_index, last)

    def save_hard_state(self, hs: HardState) -> None:
        with self._hard_state_lock:
            with self._lock:
                self._check_usable()
                saved = SavedHardState(hs, self._commit_to_record())
            self._save(saved)

    # --- the commit index (recorded lazily: never an fsync of its own per write) ---------------

    def note_commit(self, index: int) -> None:
        """Entries up to `index` are committed. Only remembered: it reaches the disk with the
        next hard-state change, `save_commit()` or `close()`, never exceeding what is synced."""
        if index > self._commit_noted:
            self._commit_noted = index

    def save_commit(self) -> bool:
        """Record the noted commit index (as far as the log is durable) if it moved since it was
        last recorded: an atomic rewrite of the hard-state file. Returns whether it wrote."""
        with self._hard_state_lock:
            with self._lock:
                self._check_usable()
                commit = self._commit_to_record()
                if commit <= self._saved.commit:
                    return False
                saved = SavedHardState(self._saved.hard_state, commit)
            self._save(saved)
            return True

    @property
    def recorded_commit(self) -> int:
        """The commit index the hard-state file holds."""
        return self._saved.commit

    def _commit_to_record(self) -> int:
        return max(self._saved.commit, min(self._commit_noted, self._durable_index))

    def _save(self, saved: SavedHardState) -> None:
        """Write the hard-state file (the caller holds `_hard_state_lock`)."""
        with self._failing_for_good(self._hard_state_file.path):
            self._hard_state_file.save(saved)
        self._saved = saved

    def install_snapshot(self, meta: SnapshotMeta) -> None:
        current = self._start.snapshot
        if meta.index < current.index:
            raise ValueError(
                f"snapshot at index {meta.index} is older than the current one at {current.index}"
            )
        self.sync()
        with self._lock:
            self._check_usable()
            with self._failing_for_good(self._start_file.path):
                if self._holds(meta.index, meta.term):
                    self._move_start(LogStart(self._start.generation, meta, meta.index, meta.term))
                else:
                    self._discard_log(meta)

    def compact(self, index: int, retain_after: int | None = None) -> None:
        if index > self._log.last_index():
            raise ValueError(
                f"cannot compact to {index}: the last index is {self._log.last_index()}"
            )
        self.sync()
        with self._lock:
            self._check_usable()
            snapshot = self._start.snapshot
            if index > snapshot.index:
                snapshot = self._log.snapshot_at(index, snapshot)
            limit = min(index - self.keep_trailing_entries, snapshot.index)
            if retain_after is not None:
                limit = min(limit, retain_after)
            base_index = self._log.base_index
            for segment in self._segments[:-1]:
                if segment.last_index > limit:
                    break
                base_index = max(base_index, segment.last_index)
            start = LogStart(
                self._start.generation, snapshot, base_index, self._log.term(base_index)
            )
            if start != self._start:
                with self._failing_for_good(self._start_file.path):
                    self._move_start(start)

    # --- LogStorage: read side (first_index, last_index, term, entries: EntryLogReads) -----

    def close(self) -> None:
        """Record the commit index once more (a clean stop leaves it current), then release."""
        if not self._closed and self._failed is None:
            try:
                self.save_commit()
            except (OSError, StorageError) as exc:
                log.warning("could not record the commit index in %s at close: %s",
                            self._hard_state_file.path, exc)
        with self._lock:
            self._closed = True
            for segment in self._segments:
                if segment.fd is not None:
                    os.close(segment.fd)
                    segment.fd = None

    # --- beyond the protocol ------------------------------------------------------------------

    def sealed_segments(self) -> list[SegmentInfo]:
        """Every segment but the newest, oldest first. Only a truncation reaching back into one
        rewrites it, and truncations never go below the commit index: so the archiver may ship
        those whose last index is committed."""
        with self._lock:
            return [SegmentInfo(s.path, s.first_index, s.last_index) for s in self._segments[:-1]]

    # --- write path ---------------------------------------------------------------------------

    @property
    def _active(self) -> Segment:
        return self._segments[-1]

    def _write(self, entries: Sequence[Entry]) -> None:
        """Encode `entries` into one buffer per segment they land in, one os.write each."""
        segment = self._active
        encode = self._encode
        limit = self.segment_bytes
        parts: list[bytes] = []
        offsets = array("Q")
        position = segment.size
        for entry in entries:
            record = encode(entry)
            if position + len(record) > limit and (segment.offsets or offsets):
                self._write_records(segment, parts, offsets)
                segment = self._rotate(entry.index)
                parts, offsets, position = [], array("Q"), segment.size
            offsets.append(position)
            parts.append(record)
            position += len(record)
        self._write_records(segment, parts, offsets)

    def _write_records(self, segment: Segment, parts: list[bytes], offsets: array) -> None:
        buffer = b"".join(parts)
        write_all(segment.fd, buffer)
        segment.offsets.extend(offsets)
        segment.size += len(buffer)

    def _rotate(self, first_index: int) -> Segment:
        """Seal the active segment (durable and whole before its successor exists) and start a
        new one at `first_index`."""
        sealed = self._active
        if self._fsync:
            datasync(sealed.fd)
        os.fchmod(sealed.fd, READ_ONLY)
        os.close(sealed.fd)
        sealed.fd = None
        segment = self._create_segment(first_index)
        self._segments.append(segment)
        return segment

    def _create_segment(self, first_index: int) -> Segment:
        """A new segment holding only its header, created under a temporary name and renamed
        once its header is durable, so a crash never leaves a segment with a partial header."""
        path = self.wal_dir / segment_name(first_index)
        temp = path.with_name(path.name + TEMP_SUFFIX)
        header = encode_header(self.cluster_id, self._start.generation, first_index)
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, WRITABLE)
        try:
            write_all(fd, header)
            if self._fsync:
                datasync(fd)
            os.replace(temp, path)
        except BaseException:
            os.close(fd)
            temp.unlink(missing_ok=True)
            raise
        self._dir_changes += 1
        return Segment(path, first_index, array("Q"), len(header), fd)

    def _truncate_from(self, index: int) -> None:
        """Durably remove records `index ..= last`. Newer segments go first (and that is made
        durable first), so a crash half-way leaves a prefix of the old log, never a gap."""
        removed = False
        while self._active.first_index > index:
            doomed = self._segments.pop()
            if doomed.fd is not None:
                os.close(doomed.fd)
            doomed.path.unlink()
            removed = True
        if removed and self._fsync:
            fsync_dir(self.wal_dir)
        self._truncations += 1
        self._durable_index = min(self._durable_index, index - 1)
        segment = self._active
        keep = index - segment.first_index
        offset = segment.offsets[keep]
        if segment.fd is None:  # a sealed segment becomes the active one again
            segment.fd = _open_for_append(segment.path)
        os.ftruncate(segment.fd, offset)
        if self._fsync:
            datasync(segment.fd)
        del segment.offsets[keep:]
        segment.size = offset
        self._log.truncate_from(index)

    def _move_start(self, start: LogStart) -> None:
        """Record a new log start (the commit point), then forget and delete what lies before
        it: whole sealed segments only; the rest of a straddling segment is skipped on recovery."""
        self._start_file.save(start)
        self._start = start
        self._log.drop_through(start.base_index)
        removed = False
        while len(self._segments) > 1 and self._segments[0].last_index <= start.base_index:
            self._segments.pop(0).path.unlink()
            removed = True
        if removed and self._fsync:
            fsync_dir(self.wal_dir)

    def _discard_log(self, meta: SnapshotMeta) -> None:
        """Drop the whole log for a snapshot it does not match, in a new generation."""
        start = LogStart(self._start.generation + 1, meta, meta.index, meta.term)
        self._start_file.save(start)  # from here on, every existing segment is stale
        self._start = start
        for segment in reversed(self._segments):
            if segment.fd is not None:
                os.close(segment.fd)
            segment.path.unlink()
        self._segments = [self._create_segment(meta.index + 1)]
        if self._fsync:
            fsync_dir(self.wal_dir)
        self._synced_dir_changes = self._dir_changes
        self._log.reset(meta.index, meta.term)
        self._truncations += 1
        self._durable_index = meta.index  # the snapshot covers the log up to here

    def _holds(self, index: int, term: int) -> bool:
        log_ = self._log
        return log_.base_index <= index <= log_.last_index() and log_.term(index) == term

    def _check_usable(self) -> None:
        if self._closed:
            raise ValueError("storage is closed")
        if self._failed is not None:
            raise StorageFailedError(
                f"an earlier write or fsync in {self.wal_dir} failed ({self._failed}); what is on "
                "disk is unknown until the member restarts and recovers"
            ) from self._failed

    @contextmanager
    def _failing_for_good(self, path: Path) -> Iterator[None]:
        """An OSError while writing `path` leaves the files in an unknown state: refuse further
        use. A full disk is said as such (DiskFullError, exit 3), with the space left."""
        try:
            yield
        except OSError as exc:
            self._failed = exc
            full = disk_full(exc, self.data_dir, path)
            if full is not None:
                raise full from exc
            raise

    # --- recovery -----------------------------------------------------------------------------

    def _recover(self) -> None:
        """Read everything and check it; only then tidy up (delete stale segments, cut a torn
        tail, create what a fresh data dir lacks), so a refused data dir is left as it was."""
        if self.wal_dir.is_dir():
            for leftover in remove_temp_files(self.wal_dir):
                log.info("removed %s, left over from an interrupted write", leftover)
        saved = self._hard_state_file.load()
        found = self._list_segments()
        start_exists = self._start_file.exists()
        if not start_exists and found:
            raise CorruptDataError(
                self._start_file.path, 0, "file is missing although log segments exist"
            )
        self._start = self._start_file.load()
        headers, stale = self._read_headers(found)
        segments, torn = self._scan(headers)
        self._check_hard_state(saved, segments)

        ensure_dir(self.wal_dir, fsync=self._fsync)
        if saved is None:  # a fresh data dir: the file exists before any entry does
            saved = SavedHardState()
            self._hard_state_file.save(saved)
        self._saved = saved
        if not start_exists:
            self._start_file.save(self._start)
        for path, why in stale:
            log.info("removing %s: %s", path, why)
            self._unlink_at_recovery(path)
        if torn is not None:
            self._cut_torn_tail(*torn)
        self._segments = segments
        last = segments[-1].last_index if segments else None
        snapshot = self._start.snapshot
        if last is None or last < snapshot.index:
            self._restart_log_after_snapshot(last)
        if self._active.fd is None:
            self._active.fd = _open_for_append(self._active.path)
        if self._fsync:
            # What a killed process wrote but never synced may still be only in the page cache:
            # make it durable, so the commit index recorded from now on never runs ahead of it.
            datasync(self._active.fd)
            if self._dir_changes:
                fsync_dir(self.wal_dir)
        self._synced_dir_changes = self._dir_changes
        self._durable_index = self._log.last_index()
        self._commit_noted = saved.commit

    def _check_hard_state(self, saved: SavedHardState | None, segments: list[Segment]) -> None:
        """Refuse a log whose hard state is gone, or that ends before its recorded commit."""
        path = self._hard_state_file.path
        start = self._start
        written = any(s.offsets for s in segments) or start.snapshot.term or start.base_term
        if saved is None and written:
            raise CorruptDataError(
                path,
                0,
                f"file is missing although the log in {self.wal_dir} holds entries: the term and "
                "vote this member gave are lost, so it could vote twice in one term",
            )
        end = max(segments[-1].last_index if segments else 0, start.snapshot.index)
        if saved is not None and saved.commit > end:
            newest = segments[-1] if segments else None
            raise CorruptDataError(
                newest.path if newest else self.wal_dir,
                newest.size if newest else 0,
                f"the log ends at index {end}"
                f"{', in this segment' if newest else ' (no segment holds an entry)'}, but "
                f"{path} records index {saved.commit} as committed: committed entries are "
                "missing (a newer segment was deleted, or the volume was restored from an older "
                "copy)",
            )

    def _list_segments(self) -> list[tuple[int, Path]]:
        found = []
        if not self.wal_dir.is_dir():
            return found
        for path in self.wal_dir.iterdir():
            if path.name == _START_NAME:
                continue
            first_index = parse_segment_name(path.name)
            if first_index is None:
                if path.suffix == SUFFIX:
                    raise CorruptDataError(path, 0, "segment file name is not a 16-digit index")
                log.warning("ignoring unexpected file %s in the log directory", path)
                continue
            found.append((first_index, path))
        found.sort()
        return found

    def _read_headers(self, found: list[tuple[int, Path]]
                      ) -> tuple[list[tuple[Path, SegmentHeader]], list[tuple[Path, str]]]:
        """Check every segment's header. Returns the segments of the log, and those the log
        start says are gone (to delete once recovery has checked everything), with why."""
        generation = self._start.generation
        kept = []
        stale = []
        for first_index, path in found:
            with open(path, "rb") as file:
                header = decode_header(file.read(_HEADER_READ), path)
            if header.cluster_id != self.cluster_id:
                raise CorruptDataError(
                    path,
                    0,
                    f"segment belongs to cluster {header.cluster_id!r}, but this member is "
                    f"configured for cluster {self.cluster_id!r}",
                    advice="check --data-dir and --cluster-id; another cluster's data is never "
                    "merged, so give this member its own (or an empty) data dir",
                )
            if header.first_index != first_index:
                raise CorruptDataError(
                    path,
                    0,
                    f"header says the first index is {header.first_index}, the name says "
                    f"{first_index}",
                )
            if header.generation > generation:
                raise CorruptDataError(
                    path,
                    0,
                    f"segment generation {header.generation} is newer than the log "
                    f"start's ({generation}, in {self._start_file.path})",
                )
            if header.generation < generation:
                stale.append((path, "its log was discarded by a snapshot install"))
                continue
            kept.append((path, header))
        # Segments that compaction had deleted but whose removal did not survive a crash.
        while len(kept) > 1 and kept[1][1].first_index - 1 <= self._start.base_index:
            stale.append((kept.pop(0)[0], "it was compacted"))
        return kept, stale

    def _scan(self, headers: list[tuple[Path, SegmentHeader]]
              ) -> tuple[list[Segment], tuple[Path, int, int, str] | None]:
        """Read every record; refuse anything but a torn tail of the newest segment, which is
        returned as (path, offset of the damage, bytes from there, why) for `_cut_torn_tail`."""
        base_index = self._start.base_index
        entries: list[Entry] = []
        segments: list[Segment] = []
        torn = None
        for position, (path, header) in enumerate(headers):
            newest = position == len(headers) - 1
            if not segments and header.first_index > base_index + 1:
                raise CorruptDataError(
                    path,
                    0,
                    f"the log must continue right after index {base_index} (see "
                    f"{self._start_file.path}), but its oldest segment starts at index "
                    f"{header.first_index}: entries are missing",
                )
            if segments and header.first_index != segments[-1].last_index + 1:
                raise CorruptDataError(
                    path,
                    0,
                    f"gap between segments: the previous one ends at index "
                    f"{segments[-1].last_index}, this one starts at index {header.first_index}",
                )
            buffer = path.read_bytes()
            versions = header.record_versions
            found = scan_records(buffer, header.size, header.first_index, base_index, versions)
            if found.error is not None:
                expected = header.first_index + len(found.offsets)
                self._check_torn_tail(path, buffer, found, expected, newest, versions)
                torn = (path, found.end, len(buffer) - found.end, found.error)
            segments.append(Segment(path, header.first_index, found.offsets, found.end))
            entries.extend(found.entries)
        self._log = EntryLog(base_index, self._start.base_term, entries)
        return segments, torn

    def _check_torn_tail(
        self, path: Path, buffer: bytes, found: ScanResult, expected_index: int, newest: bool,
        versions: frozenset[int],
    ) -> None:
        """Raise unless the damage is a torn tail of the newest segment: see the module
        docstring."""
        offset, error = found.end, found.error
        if not newest:
            raise CorruptDataError(path, offset, f"{error} in a sealed segment")
        if not found.torn:
            raise CorruptDataError(path, offset, error)
        later = valid_record_after(buffer, offset, expected_index, versions)
        if later is not None:
            raise CorruptDataError(
                path,
                offset,
                f"{error}, yet an intact record follows at byte offset {later}: "
                "this is damage inside the log, not a write cut short by a crash",
            )

    def _cut_torn_tail(self, path: Path, offset: int, length: int, error: str) -> None:
        log.warning(
            "%s: %s at byte offset %d; cutting off the last %d bytes as a write torn by a crash "
            "(they were never synced, so nothing acknowledged is lost)",
            path,
            error,
            offset,
            length,
        )
        os.chmod(path, WRITABLE)  # the newest segment may have been sealed just before a crash
        with open(path, "r+b") as file:
            file.truncate(offset)
            if self._fsync:
                os.fsync(file.fileno())

    def _restart_log_after_snapshot(self, last: int | None) -> None:
        """No segment reaches the snapshot index (a fresh data dir, or a crash in the middle of
        discarding the log): the log restarts, empty, right after the snapshot."""
        snapshot = self._start.snapshot
        if last is not None:
            log.warning(
                "the log ends at index %d, short of the snapshot at %d; restarting it after the "
                "snapshot",
                last,
                snapshot.index,
            )
        start = LogStart(self._start.generation, snapshot, snapshot.index, snapshot.term)
        if start != self._start:
            self._start_file.save(start)
            self._start = start
        for segment in self._segments:
            self._unlink_at_recovery(segment.path)
        self._log = EntryLog(snapshot.index, snapshot.term)
        self._segments = [self._create_segment(snapshot.index + 1)]

    def _unlink_at_recovery(self, path: Path) -> None:
        path.unlink()
        self._dir_changes += 1


def _open_for_append(path: Path) -> int:
    """Open a segment to append to it: the newest after recovery, or a sealed one that a
    truncation reaches back into (it becomes the newest again, so it is made writable)."""
    os.chmod(path, WRITABLE)
    return os.open(path, os.O_WRONLY | os.O_APPEND)
