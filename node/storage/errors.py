"""Errors raised by the member's durable storage.

They are split by what the operator has to do about them, because the node CLI maps them to
exit code 3 ("a data dir it will not use") and prints `str(error)` as the whole explanation:
`CorruptDataError` means the bytes on disk cannot be trusted, `DataDirError` means the data dir
is fine but not this member's. Read-side range errors are ordinary `LookupError`s the consensus
core handles (a compacted index means "send a snapshot instead").
"""

from __future__ import annotations

import os

RESTORE_FROM_PEERS = (
    "this member's durable state cannot be trusted: restore it from its peers "
    "(stop it, remove its data dir, and re-add it to the cluster as a learner)"
)


class StorageError(Exception):
    """Base class of every storage failure that is not a caller's programming error."""


class CorruptDataError(StorageError):
    """Bytes on disk that recovery will not repair: damage that is not a torn write.

    Carries the file and byte offset so that the message (and exit-code-3 log line) lets an
    operator look at exactly the damaged spot before deciding what to do.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        offset: int,
        reason: str,
        advice: str = RESTORE_FROM_PEERS,
    ) -> None:
        self.path = os.fspath(path)
        self.offset = offset
        self.reason = reason
        self.advice = advice
        super().__init__(str(self))

    def __str__(self) -> str:
        where = f"{self.path} at byte offset {self.offset}"
        return f"corrupt data in {where}: {self.reason}; {self.advice}"

    def __reduce__(self):  # keep the four fields when pickled across processes
        return (type(self), (self.path, self.offset, self.reason, self.advice))


class DataDirError(StorageError):
    """The data dir is readable but belongs to another cluster or member, or to nobody."""


class StorageFailedError(StorageError):
    """An earlier fsync failed: what the page cache holds is unknown, so nothing more is written.

    After a failed fsync Linux may already have dropped the dirty pages it could not write
    ("fsyncgate"); retrying would report success for data that is gone. The only safe move is to
    restart the member and let recovery read what really is on disk.
    """


class LogRangeError(LookupError):
    """An index outside what the log holds."""


class CompactedError(LogRangeError):
    """The index is at or below the point the log was compacted to: use the snapshot."""


class UnavailableError(LogRangeError):
    """The index is beyond the last entry of the log."""
