"""A member's durable storage: the write-ahead log, hard state, snapshots, data-dir identity.

`LogStorage` (protocol.py) is what the runtime programs against; `MemoryStorage` is its
reference implementation and `DiskStorage` the real one. Snapshots live beside the log in a
`SnapshotStore`; the runtime keeps the two in step (a snapshot is made durable in the store
first, then `LogStorage.compact()` or `install_snapshot()` moves the log past it). On start it
compares `SnapshotStore.latest()` with `recover().snapshot`: a store snapshot newer than the
log's start (a crash between those two steps) is installed again.
"""

from .datadir import DataDir, Identity, read_admission, write_admission
from .dirlock import DataDirInUse, DataDirLock, lock_data_dir
from .errors import (
    CompactedError,
    CorruptDataError,
    DataDirError,
    LogRangeError,
    StorageError,
    StorageFailedError,
    UnavailableError,
)
from .memory import MemoryStorage
from .protocol import LogStorage
from .snapshots import PayloadReader, SnapshotStore, SnapshotWriter, StoredSnapshot
from .space import DiskFullError, free_bytes
from .wal import DiskStorage, SegmentInfo

__all__ = [
    "CompactedError",
    "CorruptDataError",
    "DataDir",
    "DataDirError",
    "DataDirInUse",
    "DataDirLock",
    "DiskFullError",
    "DiskStorage",
    "Identity",
    "LogRangeError",
    "LogStorage",
    "MemoryStorage",
    "PayloadReader",
    "SegmentInfo",
    "SnapshotStore",
    "SnapshotWriter",
    "StorageError",
    "StorageFailedError",
    "StoredSnapshot",
    "UnavailableError",
    "free_bytes",
    "lock_data_dir",
    "read_admission",
    "write_admission",
]
