"""What a data dir holds, byte for byte, to show that a refused start changed nothing."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

from flotilla.node.storage.hardstate import HardStateFile, SavedHardState

LOCK_FILE = "flotilla.lock"


def files_of(root: Path, *, lock_content: bool = True) -> dict[str, tuple[int, str | None]]:
    """{relative path: (mode, SHA-256 of a file's bytes or None for a directory)}.

    `lock_content=False` leaves out what the lock file says: a process that takes the lock
    writes its pid there before it looks at anything else (the lock file still counts)."""
    found = {}
    for path in sorted(root.rglob("*")):
        name = str(path.relative_to(root))
        digest = None
        if path.is_file() and (lock_content or name != LOCK_FILE):
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
        found[name] = (path.stat().st_mode & 0o7777, digest)
    return found


def wait_commit_recorded(data_dir: Path, index: int, timeout: float = 5.0) -> None:
    """Return once the hard state of a running member records `index` as committed (it does so
    about once a second), after which an idle member leaves its data dir alone."""
    hard_state = HardStateFile(data_dir / "hardstate")
    deadline = time.monotonic() + timeout
    while (hard_state.load() or SavedHardState()).commit < index:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{data_dir} did not record index {index} as committed within "
                               f"{timeout}s")
        time.sleep(0.05)
