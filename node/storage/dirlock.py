"""One live process per data dir: an exclusive lock on a file inside it.

Two members on one data dir would append to one log and vote twice with one hard state; the
second must refuse before it reads or writes anything there (a restore on an empty dir
included). The lock is `flock`ed for the life of the process, so the kernel drops it when the
process ends however it ends (SIGKILL included): no stale lock to clean up by hand. A child
the member forks to write a snapshot holds it too until it exits, which is right, since it
still writes into the directory. The holder's pid is written into the file so that the
refusal can name it.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from .errors import DataDirError
from .fsutil import ensure_dir, write_all

LOCK_FILE = "flotilla.lock"


class DataDirInUse(DataDirError):
    """Another live process holds the data dir."""

    def __init__(self, path: Path, holder: int | None) -> None:
        self.path = path
        self.holder = holder
        who = f"pid {holder}" if holder is not None else "its pid is not written yet"
        super().__init__(f"{path} is in use by another flotilla node ({who}); stop it first")


class DataDirLock:
    """The held lock of one data dir; `release` (or the process ending) lets it go."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd = fd

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing the only descriptor of the open file drops the flock
            self._fd = -1


def lock_data_dir(path: str | os.PathLike[str], *, fsync: bool = True) -> DataDirLock:
    """Create the data dir if it is missing and take its lock, or raise DataDirInUse naming
    the pid that holds it."""
    root = Path(path)
    ensure_dir(root, fsync=fsync)
    lock_path = root / LOCK_FILE
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise DataDirInUse(root, _holder(fd)) from None
        os.ftruncate(fd, 0)
        write_all(fd, f"{os.getpid()}\n".encode())
    except BaseException:
        os.close(fd)
        raise
    return DataDirLock(root, fd)


def _holder(fd: int) -> int | None:
    """The pid the holder wrote, or None if it has not written it yet (it just took the lock)."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None
