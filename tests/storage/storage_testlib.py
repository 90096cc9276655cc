"""Shared helpers of the storage tests: entry factories and the two backends under test."""

from __future__ import annotations

from pathlib import Path

from flotilla.node.consensus.types import Entry, EntryKind
from flotilla.node.storage import DiskStorage, MemoryStorage

CLUSTER = "test-cluster"
# Small enough that a few dozen short entries span many segments.
SMALL_SEGMENT = 256


def payload(index: int, salt: str = "") -> bytes:
    """Deterministic entry data of varying length, so offsets differ from record to record."""
    return (f"{salt}{index}|".encode() * (1 + index % 5))[: 3 + (index * 7) % 29]


EPOCH_MS = 1_800_000_000_000


def entries(lo: int, hi: int, term: int, salt: str = "", *, timed: bool = True) -> list[Entry]:
    """Entries lo..hi-1 of one term; every seventh is a NOOP so kinds round-trip too. Their
    times grow with the index, a few share one (`timed=False`: time 0, as the first release's
    format reads back)."""
    return [
        Entry(i, term, EntryKind.NOOP if i % 7 == 0 else EntryKind.NORMAL, payload(i, salt),
              EPOCH_MS + (i // 3) * 1_000 + term if timed else 0)
        for i in range(lo, hi)
    ]


class MemoryBackend:
    """Reopening is a simulated crash: `crash_copy()` keeps what was synced."""

    name = "memory"

    def __init__(self, root: Path) -> None:
        self.root = root

    def open(self, name: str = "log", *, keep_trailing_entries: int = 0) -> MemoryStorage:
        return MemoryStorage(keep_trailing_entries=keep_trailing_entries)

    def reopen(self, storage: MemoryStorage) -> MemoryStorage:
        return storage.crash_copy()

    def segment_count(self, name: str = "log") -> int | None:
        return None


class DiskBackend:
    """Reopening closes the files and recovers from them in a new object."""

    name = "disk"

    def __init__(self, root: Path) -> None:
        self.root = root
        self._options: dict[int, tuple[str, int]] = {}

    def open(self, name: str = "log", *, keep_trailing_entries: int = 0) -> DiskStorage:
        storage = DiskStorage(
            self.root / name,
            cluster_id=CLUSTER,
            segment_bytes=SMALL_SEGMENT,
            keep_trailing_entries=keep_trailing_entries,
        )
        self._options[id(storage)] = (name, keep_trailing_entries)
        return storage

    def reopen(self, storage: DiskStorage) -> DiskStorage:
        name, keep = self._options.pop(id(storage))
        storage.close()
        return self.open(name, keep_trailing_entries=keep)

    def segment_count(self, name: str = "log") -> int | None:
        return len(list((self.root / name / "wal").glob("*.seg")))


def newest_segment(data_dir: Path) -> Path:
    return sorted((data_dir / "wal").glob("*.seg"))[-1]


def segments(data_dir: Path) -> list[Path]:
    return sorted((data_dir / "wal").glob("*.seg"))
