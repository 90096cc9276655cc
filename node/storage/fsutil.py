"""The few file-system moves that make writes durable, written once.

A rename is only durable once the directory holding it is fsynced, and a file's contents only
once the file is; forgetting either loses data in a power cut while every test on a running
machine still passes. Every storage module goes through these helpers so that there is one
place to get it right (and one `fsync=False` switch for the `--fsync false` development mode).
"""

from __future__ import annotations

import os
from pathlib import Path

TEMP_SUFFIX = ".tmp"
# What the node creates in its data dir is its own: another local user must not read the log
# (every value ever written) or the hard state. Modes are given explicitly, not left to umask.
FILE_MODE = 0o600
DIR_MODE = 0o700

# fdatasync skips metadata a reader does not need (mtime) but includes the file size, which is
# all an append needs; where it does not exist (macOS), fsync is the portable fallback.
datasync = getattr(os, "fdatasync", os.fsync)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make creations, renames and removals of entries in directory `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def ensure_dir(path: Path, *, fsync: bool = True) -> None:
    """Create `path` (and parents) if missing, mode 0700, durably: a new directory is an entry
    of its parent, so the parent is fsynced too. Existing directories keep their mode (a volume's
    mount point may belong to someone else)."""
    if path.is_dir():
        return
    missing = []
    probe = path
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    for created in reversed(missing):
        created.mkdir(mode=DIR_MODE, exist_ok=True)
    if fsync:
        for created in missing:
            fsync_dir(created.parent)


def make_private(path: Path) -> bool:
    """Close a directory of ours that others may enter (a data dir an older build made 0755):
    mode 0700 keeps them out of everything in it. Someone else's directory (a volume's mount
    point) is left as it is. Returns whether it changed the mode."""
    st = path.stat()
    if not st.st_mode & 0o077 or st.st_uid != os.geteuid():
        return False
    os.chmod(path, DIR_MODE)
    return True


def write_atomic(path: Path, data: bytes, *, fsync: bool = True) -> None:
    """Replace `path` with `data` so that after a crash it holds either the old or the new
    bytes, never a mix: write a temporary file, fsync it, rename it over, fsync the dir."""
    temp = path.with_name(path.name + TEMP_SUFFIX)
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        try:
            write_all(fd, data)
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        temp.unlink(missing_ok=True)  # a full disk gets back what the half-written copy took
        raise
    os.replace(temp, path)
    if fsync:
        fsync_dir(path.parent)


def write_all(fd: int, data: bytes | memoryview) -> None:
    """`os.write` until everything is written (a regular file only writes short on errors such
    as a full disk, or past 2 GiB in one call)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def remove_temp_files(directory: Path) -> list[Path]:
    """Delete what an interrupted `write_atomic` (or segment creation) left behind."""
    removed = []
    for leftover in directory.glob("*" + TEMP_SUFFIX):
        leftover.unlink(missing_ok=True)
        removed.append(leftover)
    return removed
