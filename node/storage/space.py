"""Free space on the data dir's file system, and the error a full disk becomes.

A full disk is not a bug (exit 1) but a data dir the member cannot use as it is (exit 3): the
operator has to free space or grow the volume. So every write path turns ENOSPC (and EDQUOT, a
full quota) into `DiskFullError`, whose message names the file and gives the bytes still free,
which is what the operator needs to tell "full" from "a quota" or "a tiny volume".
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from .errors import StorageError

FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


def free_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes an unprivileged writer may still use on the file system holding `path`."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


class DiskFullError(StorageError):
    """A write failed because the file system holding the data dir is full."""

    def __init__(self, path: str | os.PathLike[str], data_dir: str | os.PathLike[str],
                 free: int | None) -> None:
        self.path = os.fspath(path)
        self.data_dir = os.fspath(data_dir)
        self.free = free
        super().__init__(str(self))

    def __str__(self) -> str:
        left = "an unknown number of" if self.free is None else str(self.free)
        return (f"no space left on device writing {self.path}: {left} bytes free on the file "
                f"system of {self.data_dir}; free space there or grow the volume, then restart "
                "the member (nothing acknowledged was lost)")

    def __reduce__(self):
        return (type(self), (self.path, self.data_dir, self.free))


def is_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in FULL


def disk_full(exc: BaseException, data_dir: str | os.PathLike[str],
              path: str | os.PathLike[str] | None = None) -> DiskFullError | None:
    """`exc` as a DiskFullError if it is a full disk (None otherwise). `path` is the file being
    written when the caller knows it better than the error does."""
    if isinstance(exc, DiskFullError):
        return exc
    if not is_full(exc):
        return None
    assert isinstance(exc, OSError)
    where = path if path is not None else exc.filename or data_dir
    probe = Path(data_dir)
    while not probe.exists() and probe != probe.parent:  # at start it may not exist yet
        probe = probe.parent
    try:
        free = free_bytes(probe)
    except OSError:
        free = None
    full = DiskFullError(where, data_dir, free)
    full.__cause__ = exc
    return full
