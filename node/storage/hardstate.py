"""The hard-state file: the term and vote a member must never forget.

A member that forgets its vote can vote twice in one term and elect two leaders, so the file is
replaced atomically and durably (temp file, fsync, rename, fsync dir) before `save()` returns,
and a damaged file is refused rather than read as "no vote". Elections are rare, so the two
fsyncs per change cost nothing on the write path.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgpack
from flotilla.node.consensus.types import HardState

from .checkedfile import read_checked, write_checked
from .errors import CorruptDataError

MAGIC = b"FLOTHST\x00"
VERSION = 1


class HardStateFile:
    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = True) -> None:
        self.path = Path(path)
        self._fsync = fsync

    def load(self) -> HardState:
        """The saved hard state, or the zero one if none was ever saved."""
        payload = read_checked(self.path, MAGIC, VERSION)
        if payload is None:
            return HardState()
        try:
            term, vote = msgpack.unpackb(payload)
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            raise CorruptDataError(self.path, 0, f"payload does not decode: {exc}") from exc
        if not isinstance(term, int) or not (vote is None or isinstance(vote, str)):
            raise CorruptDataError(self.path, 0, f"unexpected payload {[term, vote]!r}")
        return HardState(term=term, vote=vote)

    def save(self, hs: HardState) -> None:
        payload = msgpack.packb([hs.term, hs.vote])
        write_checked(self.path, MAGIC, VERSION, payload, fsync=self._fsync)
