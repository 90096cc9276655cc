"""`Archive`: the small object-store interface every backend implements, and what it shares.

An archive is a flat namespace of immutable objects named by `/`-separated keys (relative to
the archive URL's root). Two backends implement it: `S3Archive` (s3.py) and `FileArchive`
(filesystem.py); tests/archive/test_conformance.py runs the same suite against both.

The contract, for every backend:
- Write once. `put_*` creates an object or, if one exists, succeeds only when its SHA-256
  equals the new content's (an idempotent retry after a crash) and raises ArchiveConflict
  otherwise. A reader never sees a partly written object.
- Every object carries the SHA-256 of its bytes, recorded by the writer (S3 user metadata
  `sha256`; a `<key>.sha256` sidecar on a file system). Every read recomputes it and raises
  ArchiveCorrupt on a mismatch, naming the object and both digests. A reader that holds an
  independent digest (a manifest's) passes it as `expected_sha256` and it is checked too.
- Big objects are streamed (`put_file`, `download`), never read into memory whole.
- Every method may be called from several threads at once.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

from .errors import ArchiveCorrupt, checksum_mismatch

CHUNK = 1 << 20
MiB = 1 << 20


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    size: int
    sha256: str | None  # None only for an object the archive did not write (or damaged)


@dataclass(frozen=True, slots=True)
class ArchiveSettings:
    """Tuning knobs; the defaults suit production, tests shrink them."""

    # S3: attempts per HTTP request in botocore's "standard" retry mode (which backs off with
    # jitter on connection errors, 5xx and throttling).
    max_attempts: int = 5
    connect_timeout: float = 5.0
    read_timeout: float = 60.0
    # Our own retry of a whole download when the response body breaks off mid-stream, which
    # botocore does not retry (it only retries until the response headers arrive).
    stream_attempts: int = 3
    retry_base_delay: float = 0.25
    # Objects at least this big go up as S3 multipart uploads of `multipart_chunksize` parts
    # (S3 requires parts of at least 5 MiB, except the last).
    multipart_threshold: int = 8 * MiB
    multipart_chunksize: int = 8 * MiB
    max_concurrency: int = 2
    # Keys per ListObjectsV2 request (S3 caps it at 1000).
    page_size: int = 1000
    # "auto": send If-None-Match: * on every create and fall back to HEAD-then-PUT if the
    # store rejects the header; "never": always HEAD-then-PUT (see docs/archive.md).
    conditional_writes: str = "auto"
    # fsync what is written locally (file archive objects, downloads); off only for tests.
    fsync: bool = True

    def __post_init__(self) -> None:
        if self.conditional_writes not in ("auto", "never"):
            raise ValueError("conditional_writes must be 'auto' or 'never'")
        if self.page_size < 1 or self.max_attempts < 1 or self.stream_attempts < 1:
            raise ValueError("page_size, max_attempts and stream_attempts must be at least 1")


class Archive(Protocol):
    """An immutable-object store (see the module docstring for the contract)."""

    url: str  # the archive's root as given to open_archive, credentials never included

    def url_for(self, key: str) -> str:
        """The full URL of `key` (for messages and the admin API's `location`)."""
        ...

    def put_bytes(self, key: str, data: bytes) -> ObjectInfo: ...

    def put_file(self, key: str, path: str | os.PathLike[str]) -> ObjectInfo:
        """Upload a local file as a stream (multipart on S3 above the threshold)."""
        ...

    def get_bytes(self, key: str, *, expected_sha256: str | None = None) -> bytes: ...

    def download(
        self, key: str, dest: str | os.PathLike[str], *, expected_sha256: str | None = None
    ) -> ObjectInfo:
        """Stream `key` into `dest`, which appears (atomically, fsynced) only once verified."""
        ...

    def head(self, key: str) -> ObjectInfo | None:
        """The object's size and recorded digest, or None if it does not exist."""
        ...

    def exists(self, key: str) -> bool: ...

    def list_keys(self, prefix: str = "") -> Iterator[str]:
        """Keys starting with `prefix` (a plain string prefix, as in S3), in sorted order."""
        ...

    def list_prefixes(self, prefix: str = "") -> list[str]:
        """The names one `/` level below `prefix` (which is empty or ends with `/`)."""
        ...

    def delete(self, key: str) -> None:
        """Remove `key`; removing a missing key is not an error."""
        ...

    def close(self) -> None: ...


def check_key(key: str) -> str:
    """Refuse keys that could escape the archive root or name nothing on a file system."""
    parts = key.split("/")
    if (
        not key
        or key.startswith("/")
        or any(part in ("", ".", "..") for part in parts)
        or "\\" in key
        or "\x00" in key
    ):
        raise ValueError(f"invalid archive key {key!r}: use relative, '/'-separated names")
    if any(part.startswith(".") for part in parts) or key.endswith(".sha256"):
        raise ValueError(
            f"invalid archive key {key!r}: names starting with '.' or ending in '.sha256' are "
            "reserved for the archive's own bookkeeping"
        )
    return key


def sha256_of_file(file: BinaryIO) -> str:
    """Digest of an open file from its current position to the end."""
    digest = hashlib.sha256()
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    while count := file.readinto(buffer):
        digest.update(view[:count])
    return digest.hexdigest()


def verify_digest(
    where: str, actual: str, recorded: str | None, expected: str | None
) -> None:
    """The one rule every read applies: the bytes must match the digest recorded with the
    object and the one the caller expects (from a manifest). An object with no recorded
    digest is accepted only when the caller vouches for it with `expected`."""
    if expected is not None and actual != expected:
        raise checksum_mismatch(where, expected, actual, "the manifest")
    if recorded is not None and actual != recorded:
        raise checksum_mismatch(where, recorded, actual, "its stored checksum")
    if recorded is None and expected is None:
        raise ArchiveCorrupt(
            f"{where} has no recorded SHA-256, so it cannot be verified: it was not written by "
            "Flotilla, or was overwritten or damaged by another tool; delete it and upload it "
            "again from a member that still has the data",
            key=where,
            actual=actual,
        )


def temp_path_beside(dest: Path) -> Path:
    """A hidden temporary name in `dest`'s directory, so the final rename stays on one file
    system (and so listing skips it)."""
    return dest.with_name(f".{dest.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
