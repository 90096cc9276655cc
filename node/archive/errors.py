"""Errors raised by the archive, split by what the caller should do about them.

`ArchiveUnavailable` is worth retrying later (the store is down or overloaded);
`ArchiveCorrupt` means an object's bytes cannot be trusted (try an older snapshot, or re-upload
from a member that still has the data); `ArchiveNotFound` means the object or archived state is
not there; `ArchiveConflict` means an immutable object already exists with other content;
`ArchiveDiverged` means the archive holds a history other than the archiving leader's log.
Every message names the object and says what to do next. None of them ever carries
credentials: the archive never sees them (boto3 reads them from the standard AWS chain).
"""

from __future__ import annotations


class ArchiveError(Exception):
    """Base class of every archive failure (also: configuration problems such as a missing
    bucket or denied access, which retrying does not fix)."""


class ArchiveUnavailable(ArchiveError):
    """The store could not be reached or answered with a server error: retry later."""


class ArchiveNotFound(ArchiveError):
    """The object, the cluster, or the requested archived state does not exist."""


class ArchiveConflict(ArchiveError):
    """An object that is written once already exists with different content (or, for a
    manifest, another writer published that sequence number first)."""


class ArchiveDiverged(ArchiveError):
    """The archive's history is not this cluster's: its last archived entry has another term
    than the archiving leader's log holds at that index (or the log does not reach it).
    Nothing is shipped on top of it."""


class ArchiveCorrupt(ArchiveError):
    """An object's bytes do not match the SHA-256 recorded for it, or do not decode.

    `key` is the object (as a URL where known); `expected` and `actual` are the two digests
    when the failure is a checksum mismatch.
    """

    def __init__(
        self,
        message: str,
        *,
        key: str | None = None,
        expected: str | None = None,
        actual: str | None = None,
    ) -> None:
        super().__init__(message)
        self.key = key
        self.expected = expected
        self.actual = actual

    def __reduce__(self):  # keep the fields when pickled across processes
        return (_rebuild_corrupt, (str(self), self.key, self.expected, self.actual))


def _rebuild_corrupt(message: str, key, expected, actual) -> ArchiveCorrupt:
    return ArchiveCorrupt(message, key=key, expected=expected, actual=actual)


def checksum_mismatch(where: str, expected: str, actual: str, recorded_by: str) -> ArchiveCorrupt:
    """The error for bytes whose SHA-256 is not the one `recorded_by` says it should be."""
    return ArchiveCorrupt(
        f"{where} is corrupt: its SHA-256 is {actual} but {recorded_by} records {expected}; "
        "do not use it (restore from an older snapshot, or delete the object and upload it "
        "again from a member that still has the data)",
        key=where,
        expected=expected,
        actual=actual,
    )
