"""The hard-state file: the term and vote a member must never forget, and its commit index.

A member that forgets its vote can vote twice in one term and elect two leaders, so the file is
replaced atomically and durably (temp file, fsync, rename, fsync dir) before `save()` returns,
and a damaged file is refused rather than read as "no vote". Elections are rare, so the two
fsyncs per change cost nothing on the write path.

The commit index (etcd's `HardState.Commit`) is recorded so that a log which lost committed
entries (its newest segment deleted, a volume restored from an old copy) is refused at start
instead of being served as if nothing were missing. It is a lower bound, written with the next
term or vote change and at most about once a second otherwise (see `DiskStorage.save_commit`),
so it never costs an fsync per write.

Format version 2 holds `[term, vote, commit]`; version 1, written before the commit index was
recorded, holds `[term, vote]` and reads as commit 0 (nothing known, nothing refused).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import msgpack
from flotilla.node.consensus.types import HardState

from .checkedfile import read_checked, write_checked
from .errors import CorruptDataError

MAGIC = b"FLOTHST\x00"
VERSION = 2
READS = (1, 2)
NAME = "hardstate"


@dataclass(frozen=True, slots=True)
class SavedHardState:
    """What the file holds: the hard state, and an index known to be committed and durable in
    this member's log when it was written."""

    hard_state: HardState = field(default_factory=HardState)
    commit: int = 0


class HardStateFile:
    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = True) -> None:
        self.path = Path(path)
        self._fsync = fsync

    def load(self) -> SavedHardState | None:
        """The saved state, or None if the file does not exist."""
        payload = read_checked(self.path, MAGIC, READS)
        if payload is None:
            return None
        try:
            fields = msgpack.unpackb(payload)
            if not isinstance(fields, list) or len(fields) not in (2, 3):
                raise ValueError(f"{fields!r} is not [term, vote] or [term, vote, commit]")
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            raise CorruptDataError(self.path, 0, f"payload does not decode: {exc}") from exc
        term, vote, commit = (*fields, 0) if len(fields) == 2 else fields
        if not (isinstance(term, int) and term >= 0 and (vote is None or isinstance(vote, str))
                and isinstance(commit, int) and commit >= 0):
            raise CorruptDataError(self.path, 0, f"unexpected payload {fields!r}")
        return SavedHardState(HardState(term=term, vote=vote), commit)

    def save(self, saved: SavedHardState) -> None:
        hs = saved.hard_state
        payload = msgpack.packb([hs.term, hs.vote, saved.commit])
        write_checked(self.path, MAGIC, VERSION, payload, fsync=self._fsync)
