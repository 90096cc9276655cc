"""Snapshot files: the state machine's state at some log index, in `<data_dir>/snap/`.

A snapshot can be hundreds of MB, so it is never held in memory: it is written as a stream
(`SnapshotStore.begin()` returns a writer the state machine writes into), checksummed as it
goes, and read back as a stream (`open_payload()`). A snapshot becomes visible only when
complete and durable: it is written under a temporary name, fsynced, renamed, and the
directory fsynced; only then are older snapshots removed. So the directory holds at most two
files: the newest good snapshot, and one in progress (or, right after a crash between the
rename and the clean-up, the two newest snapshots).

File layout (integers little-endian):

    header   magic "FLOTSNAP" | version u16 | kind length u16 | kind (UTF-8) |
             last index u64 | last term u64 | last time u64 | membership length u32 |
             membership (`Membership.encode()`) | payload length u64
    payload  whatever the state machine wrote
    trailer  CRC32 of header u32 | CRC32 of payload u32 | "FLOTSEND"

The header's CRC lives in the trailer because the payload length is only known at the end
(it is patched into the header then); two CRCs cover header and payload without re-reading.

"last time" (`SnapshotMeta.ts_ms`, the time of the entry at the last index) came with version
2. Version 1 files, written by the first release, have no such field and are read with time 0
(unknown); this build writes version 2.
"""

from __future__ import annotations

import io
import logging
import os
import re
import struct
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, NamedTuple, TypeVar

from flotilla.node.consensus.types import Membership, SnapshotMeta

from .errors import CorruptDataError
from .fsutil import FILE_MODE, TEMP_SUFFIX, ensure_dir, fsync_dir, remove_temp_files

T = TypeVar("T")

log = logging.getLogger(__name__)

MAGIC = b"FLOTSNAP"
END_MAGIC = b"FLOTSEND"
VERSION = 2
SUFFIX = ".snap"
CHUNK = 1 << 20

_FIXED = struct.Struct("<8sHH")
_POSITION = {1: struct.Struct("<QQI"), 2: struct.Struct("<QQQI")}  # by format version
_LENGTH = struct.Struct("<Q")
_TRAILER = struct.Struct("<II8s")
_NAME = re.compile(r"^snap-(\d{16})-(\d{16})\.snap$")


class StoredSnapshot(NamedTuple):
    meta: SnapshotMeta
    kind: str  # which state machine wrote the payload, e.g. "kv"
    path: Path


def snapshot_name(meta: SnapshotMeta) -> str:
    return f"snap-{meta.index:016d}-{meta.term:016d}{SUFFIX}"


def encode_header(meta: SnapshotMeta, kind: str, payload_length: int) -> bytes:
    kind_raw = kind.encode()
    membership = meta.membership.encode()
    return (
        _FIXED.pack(MAGIC, VERSION, len(kind_raw))
        + kind_raw
        + _POSITION[VERSION].pack(meta.index, meta.term, meta.ts_ms, len(membership))
        + membership
        + _LENGTH.pack(payload_length)
    )


class _Header(NamedTuple):
    raw: bytes
    meta: SnapshotMeta
    kind: str
    payload_length: int
    payload_crc: int


def _read_header(file: BinaryIO, path: Path, file_size: int) -> _Header:
    """Parse and check the header and trailer (not the payload) of an open snapshot file."""

    def read(count: int, what: str) -> bytes:
        offset = file.tell()
        if offset + count > file_size:
            raise CorruptDataError(path, offset, f"{what} runs past the end of the file")
        return file.read(count)

    fixed = read(_FIXED.size, "header")
    magic, version, kind_length = _FIXED.unpack(fixed)
    if magic != MAGIC:
        raise CorruptDataError(path, 0, f"not a Flotilla snapshot (magic {magic!r})")
    layout = _POSITION.get(version)
    if layout is None:
        raise CorruptDataError(
            path,
            8,
            f"snapshot format version {version} is not supported (this build reads versions "
            f"{', '.join(map(str, sorted(_POSITION)))})",
            advice="run the Flotilla version that wrote it, or restore from peers",
        )
    kind_raw = read(kind_length, "kind")
    position = read(layout.size, "header")
    if version == 1:
        index, term, membership_length = layout.unpack(position)
        ts_ms = 0
    else:
        index, term, ts_ms, membership_length = layout.unpack(position)
    membership_raw = read(membership_length, "membership")
    length_raw = read(_LENGTH.size, "header")
    (payload_length,) = _LENGTH.unpack(length_raw)
    raw = fixed + kind_raw + position + membership_raw + length_raw
    expected_size = len(raw) + payload_length + _TRAILER.size
    if expected_size != file_size:
        raise CorruptDataError(
            path,
            len(raw) - _LENGTH.size,
            f"header says the payload is {payload_length} bytes, "
            f"which makes a {expected_size}-byte file, but the file is {file_size} bytes",
        )
    file.seek(file_size - _TRAILER.size)
    header_crc, payload_crc, end_magic = _TRAILER.unpack(file.read(_TRAILER.size))
    if end_magic != END_MAGIC:
        raise CorruptDataError(path, file_size - _TRAILER.size, "trailer is damaged (bad magic)")
    if zlib.crc32(raw) != header_crc:
        raise CorruptDataError(path, 0, "header checksum mismatch")
    try:
        kind = kind_raw.decode()
        membership = Membership.decode(membership_raw)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CorruptDataError(path, 0, f"header fields do not decode ({exc})") from exc
    file.seek(len(raw))
    meta = SnapshotMeta(index=index, term=term, membership=membership, ts_ms=ts_ms)
    return _Header(raw, meta, kind, payload_length, payload_crc)


class SnapshotWriter:
    """A snapshot being written: a write-only file-like (`write`), then `commit()` or `abort()`.

    Used as a context manager it aborts unless committed, so an exception in the state machine
    never leaves a half-written snapshot that looks finished.
    """

    def __init__(self, store: SnapshotStore, meta: SnapshotMeta, kind: str) -> None:
        self.meta = meta
        self.kind = kind
        self._store = store
        self.final_path = store.directory / snapshot_name(meta)
        fd, temp = tempfile.mkstemp(
            dir=store.directory, prefix=self.final_path.name + ".", suffix=TEMP_SUFFIX
        )
        self.temp_path = Path(temp)
        self._file = os.fdopen(fd, "wb", buffering=CHUNK)
        self._header = encode_header(meta, kind, 0)
        self._file.write(self._header)
        self._crc = 0
        self._size = 0
        self._sealed = False
        self.closed = False

    def writable(self) -> bool:
        return True

    def write(self, data: bytes | bytearray | memoryview) -> int:
        if self.closed:
            raise ValueError("snapshot writer is already committed or aborted")
        view = memoryview(data).cast("B")
        self._crc = zlib.crc32(view, self._crc)
        self._file.write(view)
        self._size += view.nbytes
        return view.nbytes

    def written_payload(self) -> BinaryIO:
        """A reader of the payload written so far (before `commit`): to check a snapshot that
        came from elsewhere before it becomes visible. The caller closes it."""
        self._file.flush()
        reader = open(self.temp_path, "rb")  # noqa: SIM115 (the caller closes it)
        reader.seek(len(self._header))
        return reader

    def commit(self) -> Path:
        """Make the snapshot durable and visible, then remove older ones. Returns its path."""
        try:
            self.seal()
        except BaseException:
            self.abort()
            raise
        return self.publish()

    def seal(self) -> dict[str, int]:
        """Finish the file (payload length, trailer) and make it durable, but not visible.
        It touches only this writer's file, so it may run in a thread or a forked child that
        wrote the payload (`flotilla.node.statemachine.snapshots`), while `publish` runs in
        the member. Returns the payload's size and CRC32."""
        if self.closed or self._sealed:
            raise ValueError("snapshot writer is already sealed, committed or aborted")
        self._sealed = True  # a failure leaves the file to `abort`
        header = encode_header(self.meta, self.kind, self._size)
        self._file.seek(len(header) - _LENGTH.size)
        self._file.write(_LENGTH.pack(self._size))
        self._file.seek(0, io.SEEK_END)
        self._file.write(_TRAILER.pack(zlib.crc32(header), self._crc, END_MAGIC))
        self._file.flush()
        if self._store.fsync:
            os.fsync(self._file.fileno())
        return {"size": self._size, "crc32": self._crc}

    def publish(self) -> Path:
        """Rename the sealed file into place and remove older snapshots. The seal may have
        run in a forked child: this writer then only closes its copy of the file."""
        if self.closed:
            raise ValueError("snapshot writer is already committed or aborted")
        self.closed = True
        try:
            self._file.close()
            os.replace(self.temp_path, self.final_path)
        except BaseException:
            self._discard()
            self._store._finished(self, committed=False)
            raise
        if self._store.fsync:
            fsync_dir(self._store.directory)
        self._store._finished(self, committed=True)
        return self.final_path

    def flush(self) -> None:
        """Write out what is buffered (the header): before a fork, so that parent and child
        do not both hold it."""
        self._file.flush()

    def abort(self) -> None:
        """Throw the unfinished snapshot away (idempotent)."""
        if self.closed:
            return
        self.closed = True
        self._discard()
        self._store._finished(self, committed=False)

    def _discard(self) -> None:
        self._file.close()
        self.temp_path.unlink(missing_ok=True)

    def __enter__(self) -> SnapshotWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.abort()


class PayloadReader(io.RawIOBase):
    """The payload of a snapshot file as a read-only stream, checked as it is read: reading
    the last byte raises CorruptDataError if the payload checksum does not match."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self._file = open(path, "rb")  # noqa: SIM115 (closed by close())
        try:
            header = _read_header(self._file, path, os.fstat(self._file.fileno()).st_size)
        except BaseException:
            self._file.close()
            raise
        self.meta, self.kind, self.size = header.meta, header.kind, header.payload_length
        self._payload_start = len(header.raw)
        self._expected_crc = header.payload_crc
        self._remaining = header.payload_length
        self._crc = 0
        self._verified = False
        if self._remaining == 0:
            self._verify()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self._remaining == 0:
            return 0
        view = memoryview(buffer).cast("B")[: self._remaining]
        count = self._file.readinto(view)
        if not count:
            raise CorruptDataError(self.path, self._file.tell(), "payload ends early")
        self._crc = zlib.crc32(view[:count], self._crc)
        self._remaining -= count
        if self._remaining == 0:
            self._verify()
        return count

    def finish(self) -> None:
        """Read whatever the consumer left and check the payload's checksum."""
        while self.read(CHUNK):
            pass

    def _verify(self) -> None:
        if self._crc != self._expected_crc:
            raise CorruptDataError(self.path, self._payload_start, "payload checksum mismatch")
        self._verified = True

    def close(self) -> None:
        file = getattr(self, "_file", None)  # absent if opening failed
        if file is not None:
            file.close()
        super().close()


class SnapshotStore:
    """The snapshots of one member. One writer at a time (`begin()` refuses a second)."""

    def __init__(self, directory: str | os.PathLike[str], *, fsync: bool = True) -> None:
        self.directory = Path(directory)
        self.fsync = fsync
        ensure_dir(self.directory, fsync=fsync)
        for leftover in remove_temp_files(self.directory):
            log.warning("removed %s: a snapshot whose writing was interrupted", leftover)
        self._writer: SnapshotWriter | None = None

    def begin(self, meta: SnapshotMeta, kind: str) -> SnapshotWriter:
        """Start writing a snapshot of the state at `meta.index`, written by state machine
        `kind`. Write the payload into the returned writer, then `commit()` it."""
        if self._writer is not None:
            raise RuntimeError(
                f"a snapshot is already being written ({self._writer.temp_path}); commit or "
                "abort it first"
            )
        self._writer = SnapshotWriter(self, meta, kind)
        return self._writer

    def save(self, meta: SnapshotMeta, kind: str, write: Callable[[SnapshotWriter], object]
             ) -> Path:
        """Write a whole snapshot: `write(writer)` writes the payload; the file is committed
        when it returns and thrown away if anything fails. Returns its path."""
        writer = self.begin(meta, kind)
        try:
            write(writer)
            return writer.commit()
        except BaseException:
            writer.abort()
            raise

    def latest(self) -> StoredSnapshot | None:
        """The newest snapshot whose checksums verify (this reads it whole).

        A damaged newest snapshot is skipped with a WARNING. Returns None if there are no
        snapshots; raises CorruptDataError if there are some but none verifies.
        """
        found = self.load_latest(lambda _reader: None)
        return found[0] if found is not None else None

    def load_latest(self, load: Callable[[PayloadReader], T]) -> tuple[StoredSnapshot, T] | None:
        """Like `latest()`, reading the file once: `load(payload)` consumes the payload of the
        newest snapshot as it is checked (a state machine restoring itself) and its result is
        returned with the snapshot. If the checksum fails, what `load` built must be thrown
        away: the next older snapshot is tried."""
        failures: list[CorruptDataError] = []
        for path in self._committed():
            try:
                with PayloadReader(path) as reader:
                    self._check_name(path, reader.meta)
                    result = load(reader)
                    reader.finish()
            except CorruptDataError as exc:
                log.warning("snapshot %s is damaged (%s); trying an older one", path, exc)
                failures.append(exc)
                continue
            return StoredSnapshot(reader.meta, reader.kind, path), result
        if not failures:
            return None
        first = failures[0]
        raise CorruptDataError(
            first.path,
            first.offset,
            f"{first.reason} (and no other snapshot in {self.directory} verifies)",
        )

    def open_payload(self, path: str | os.PathLike[str]) -> PayloadReader:
        """A readable stream of the payload of snapshot `path` (from `latest()`)."""
        return PayloadReader(Path(path))

    def _committed(self) -> list[Path]:
        """Finished snapshot files, newest (highest index, then term) first."""
        found = []
        for path in self.directory.iterdir():
            match = _NAME.match(path.name)
            if match:
                found.append(((int(match.group(1)), int(match.group(2))), path))
            elif not path.name.endswith(TEMP_SUFFIX):
                log.warning("ignoring unexpected file %s in the snapshot directory", path)
        return [path for _, path in sorted(found, reverse=True)]

    @staticmethod
    def _check_name(path: Path, meta: SnapshotMeta) -> None:
        if path.name != snapshot_name(meta):
            raise CorruptDataError(
                path,
                0,
                f"header says index {meta.index} term {meta.term}, which does not match the "
                "file name",
            )

    def _finished(self, writer: SnapshotWriter, *, committed: bool) -> None:
        if self._writer is writer:
            self._writer = None
        if committed:
            self._keep_only(writer.final_path)

    def _keep_only(self, newest: Path) -> None:
        removed = False
        for path in self._committed():
            if path != newest:
                path.unlink(missing_ok=True)
                removed = True
        if removed and self.fsync:
            fsync_dir(self.directory)

    def adopt(self, meta: SnapshotMeta, fetch: Callable[[Path], object]) -> StoredSnapshot:
        """Make a whole snapshot file obtained elsewhere (an archive) the newest one here.

        `fetch(path)` must create `path` atomically (it appears complete or not at all, and
        durably) and check its content end to end (the archive's SHA-256): only the header is
        read here, and the payload's checksum is checked again when it is installed. Raises
        CorruptDataError (the file is removed) if it is not the snapshot `meta` names."""
        if self._writer is not None:
            raise RuntimeError(f"a snapshot is already being written ({self._writer.temp_path})")
        path = self.directory / snapshot_name(meta)
        fetch(path)
        os.chmod(path, FILE_MODE)  # a download gets the umask's mode; a snapshot is private
        try:
            with PayloadReader(path) as reader:
                found, kind = reader.meta, reader.kind
            if (found.index, found.term) != (meta.index, meta.term):
                raise CorruptDataError(path, 0, f"holds snapshot {found.index}/{found.term}, "
                                                f"not {meta.index}/{meta.term}")
        except CorruptDataError:
            path.unlink(missing_ok=True)
            raise
        self._keep_only(path)
        return StoredSnapshot(found, kind, path)
