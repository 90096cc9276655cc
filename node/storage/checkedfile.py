"""Small state files (hard state, log start) that are replaced atomically and carry a checksum.

Atomic replacement means a crash never leaves half a file, so any damage found when reading one
is real corruption, not a torn write: the reader raises `CorruptDataError` instead of guessing.
Layout: magic (8 bytes) | format version (u16) | payload length (u32) | CRC32 of payload (u32) |
payload.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Collection
from pathlib import Path

from .errors import CorruptDataError
from .fsutil import write_atomic

_HEADER = struct.Struct("<8sHII")


def write_checked(path: Path, magic: bytes, version: int, payload: bytes, *, fsync: bool) -> None:
    header = _HEADER.pack(magic, version, len(payload), zlib.crc32(payload))
    write_atomic(path, header + payload, fsync=fsync)


def read_checked(path: Path, magic: bytes, version: int | Collection[int]) -> bytes | None:
    """The payload of `path`, or None if it does not exist. `version` is the format version
    the file must have, or every version the caller reads."""
    versions = (version,) if isinstance(version, int) else tuple(sorted(version))
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    if len(raw) < _HEADER.size:
        raise CorruptDataError(path, 0, f"file is {len(raw)} bytes, shorter than its header")
    found_magic, found_version, length, crc = _HEADER.unpack_from(raw)
    if found_magic != magic:
        raise CorruptDataError(path, 0, f"bad magic {found_magic!r} (expected {magic!r})")
    if found_version not in versions:
        raise CorruptDataError(
            path,
            8,
            f"format version {found_version} is not supported (this build reads "
            f"{' and '.join(map(str, versions))})",
            advice="run a Flotilla version that wrote this data dir, or restore from peers",
        )
    payload = raw[_HEADER.size :]
    if len(payload) != length:
        raise CorruptDataError(path, 10, f"payload is {len(payload)} bytes, header says {length}")
    if zlib.crc32(payload) != crc:
        raise CorruptDataError(path, _HEADER.size, "checksum mismatch")
    return payload
