"""A small real file system for disk-full tests: a tmpfs mounted for the test, always unmounted.

`mount -t tmpfs -o size=N` needs root (or CAP_SYS_ADMIN); where it is refused the test is
skipped, saying why. tmpfs fails writes with ENOSPC exactly as a full ext4 volume does, and
`remount,size=` grows it in place, which is how a test gives a full member its space back.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def _mount(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["mount", *args], capture_output=True, text=True, timeout=30)


class SmallFilesystem:
    def __init__(self, path: Path) -> None:
        self.path = path

    def resize(self, size: str) -> None:
        """Grow (or shrink) the mounted file system, e.g. `resize("64m")`."""
        done = _mount("-o", f"remount,size={size}", str(self.path))
        if done.returncode != 0:
            raise RuntimeError(f"remounting {self.path} with size={size} failed: "
                               f"{done.stderr.strip()}")


@contextlib.contextmanager
def small_filesystem(path: Path, size: str) -> Iterator[SmallFilesystem]:
    """Mount a tmpfs of `size` (e.g. "8m") at `path` (created) for the block's duration."""
    path.mkdir(parents=True, exist_ok=True)
    try:
        done = _mount("-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path))
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot run mount here ({exc}): disk-full tests need a tmpfs mount")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs at {path} ({done.stderr.strip()}): disk-full tests "
                    "need root or CAP_SYS_ADMIN")
    try:
        yield SmallFilesystem(path)
    finally:
        done = subprocess.run(["umount", str(path)], capture_output=True, text=True, timeout=30)
        if done.returncode != 0:  # something still holds a file there: detach it anyway
            subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)
